"""Real datasets of the two papers, one module per file format (see docs/data.md).

    from kernel_attention.data import DATASETS
    corpus = DATASETS.create("wikitext-2")            # LMCorpus
    graph = DATASETS.create("cora:self_loops=true")   # GraphData
    reviews = DATASETS.create("mr")                   # ClassificationData, use protocols.kfold_indices

Nothing here downloads unless asked (``download=True`` or ``kernel-attention data check --download``).
"""

from .batching import batch_by_tokens, pad_sequences
from .bpe import BPE, detokenize, remove_bpe
from .classification import ClassificationData, load_classification
from .datasets import DATASETS, SPECS, check_dataset
from .files import DataFormatError, MissingDataError, default_root
from .parallel import ParallelText, TranslationData, prepare_translation, read_fairseq_layout, read_multi30k
from .planetoid import GraphData, load_planetoid
from .protocols import kfold_indices, mean_std, random_splits, select_best
from .uci import RegressionData, fit_scaler, load_regression
from .vocab import Vocab
from .wikitext import LMCorpus, LMOrderedIterator, load_wikitext

__all__ = [
    "DATASETS", "SPECS", "check_dataset", "default_root", "DataFormatError", "MissingDataError",
    "Vocab", "BPE", "remove_bpe", "detokenize", "batch_by_tokens", "pad_sequences",
    "LMCorpus", "LMOrderedIterator", "load_wikitext",
    "ParallelText", "TranslationData", "prepare_translation", "read_fairseq_layout", "read_multi30k",
    "ClassificationData", "load_classification", "GraphData", "load_planetoid",
    "RegressionData", "fit_scaler", "load_regression",
    "kfold_indices", "random_splits", "select_best", "mean_std",
]
