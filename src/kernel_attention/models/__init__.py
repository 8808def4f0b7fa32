"""Models built from kernel attention: one readable file per family.

    translation.py      TranslationModel     encoder-decoder (fairseq transformer_iwslt_de_en shape)
    language_model.py   LanguageModel        decoder-only with Transformer-XL segment memory
    classifier.py       SentenceClassifier   encoder + mean pooling + linear
    regressor.py        SequenceRegressor    IKA regression: the whole dataset as one sequence
    lstm.py             TNLSTM, AblatedLSTM  Transformer Networks Eqs. 13-21 with the Eq. 19 weights
    node_classifier.py  NodeClassifier       two GAT layers over an edge list (graph.py's GraphAttention)
    gp.py               GPRegressor          exact GP regression (RBF, spectral mixture), IKA Table 4's GP rows
    spectral_mixture.py SpectralMixture      the GP (SM) kernel, with a backward pass that keeps no N×N tensor
    common.py           attention configs per place, scaled embeddings, collect_decompositions

``MODELS`` builds any of them by name with typed parameters; the sizes a task knows (vocabulary sizes,
feature counts, classes) are passed as context: ``MODELS.create({"name": "lm", "d_model": 64}, vocab=100)``.
Attention configs (``attention``, ``encoder_attention``, ...) are dicts of KernelAttention arguments.

Inspection: every model's ``forward(..., need_weights=True)`` / ``attention_maps(...)`` returns the attention
weights per layer and head; ``collect_decompositions(model, lambda: model(...))`` returns the similarity
and magnitude terms (IKA Prop. 1) of every attention whose kernel has them (exp and the implicit kernels).
"""

from __future__ import annotations

from kernel_attention.nn.block import TransformerBlock
from kernel_attention.models.classifier import SentenceClassifier
from kernel_attention.models.common import collect_decompositions
from kernel_attention.models.language_model import LanguageModel
from kernel_attention.models.lstm import AblatedLSTM, TNLSTM
from kernel_attention.models.regressor import SequenceRegressor
from kernel_attention.models.translation import TranslationModel
from kernel_attention.registry import Param, Registry

__all__ = ["TransformerBlock", "TranslationModel", "LanguageModel", "SentenceClassifier", "SequenceRegressor",
           "TNLSTM", "AblatedLSTM", "MODELS", "collect_decompositions"]

MODELS = Registry("model")

_pos = dict(check=lambda x: x > 0, rule="> 0")
_prob = dict(check=lambda x: 0.0 <= x < 1.0, rule="in [0, 1)")
_NORM = Param("norm", str, "post", choices=("post", "pre"))


def _sizes(d_model, n_heads, d_ff, dropout):
    return [Param("d_model", int, d_model, **_pos), Param("n_heads", int, n_heads, **_pos),
            Param("d_ff", int, d_ff, **_pos), Param("dropout", float, dropout, **_prob)]


MODELS.register("translation", _sizes(512, 4, 1024, 0.3) + [
    Param("enc_layers", int, 6, **_pos), Param("dec_layers", int, 6, **_pos),
    Param("attention_dropout", float, 0.0, **_prob),
    Param("encoder_attention", dict, None, optional=True, doc="A: encoder self-attention"),
    Param("cross_attention", dict, None, optional=True, doc="B: encoder-decoder attention"),
    Param("decoder_attention", dict, None, optional=True, doc="C: decoder self-attention (always causal)"),
    Param("pe_at_input", bool, True), Param("share_embeddings", bool, False), Param("tie_output", bool, True),
    _NORM,
], doc="encoder-decoder Transformer (fairseq transformer_iwslt_de_en shape)")(TranslationModel)

MODELS.register("lm", _sizes(410, 10, 2100, 0.1) + [
    Param("n_layers", int, 16, **_pos), Param("d_head", int, None, optional=True, **_pos),
    Param("attention_dropout", float, 0.0, **_prob), Param("attention", dict, None, optional=True),
    Param("mem_len", int, 0, check=lambda x: x >= 0, rule=">= 0"),
    Param("clamp_len", int, None, optional=True, **_pos), Param("same_length", bool, False),
    Param("pe_at_input", bool, False), Param("tie_output", bool, True), _NORM,
    Param("adaptive", dict, None, optional=True,
          doc="adaptive soft-max {cutoffs: [...], div_value: x}: with tie_output Transformer-XL's, tied to an "
              "adaptive input embedding (x default 1), else torch's untied one (x default 4)"),
], doc="decoder-only LM with Transformer-XL memory")(LanguageModel)

MODELS.register("classifier", _sizes(128, 4, 256, 0.1) + [
    Param("n_layers", int, 2, **_pos), Param("attention", dict, None, optional=True),
    Param("pe_at_input", bool, True), _NORM,
], doc="sentence classifier: encoder + mean pooling + linear")(SentenceClassifier)

MODELS.register("regressor", [
    Param("d_model", int, 64, **_pos), Param("n_heads", int, 8, **_pos), Param("n_layers", int, 1, **_pos),
    Param("d_ff", int, None, optional=True, **_pos), Param("dropout", float, 0.0, **_prob),
    Param("attention", dict, None, optional=True),
], doc="IKA regression: the whole dataset as one sequence")(SequenceRegressor)


#: The kernels of models/gp.py, named here so that the registry does not import GPyTorch (an optional extra).
GP_KERNELS = ("rbf", "sm")


def _gp(in_features: int, *, kernel: str = "rbf", mixtures: int = 4, restarts: int = 10, ard: bool = True,
        out_features: int = 1):
    """exact Gaussian-process regression (GPyTorch), the GP rows of IKA Table 4"""
    try:  # GPyTorch is the optional 'baselines' extra: the attention models do not need it
        from kernel_attention.models.gp import GPRegressor
    except ImportError as e:
        raise ImportError(f"model 'gp' needs GPyTorch ({e}); install it with: pip install "
                          "'kernel-attention[baselines]'") from e
    return GPRegressor(in_features, kernel=kernel, mixtures=mixtures, restarts=restarts, ard=ard,
                       out_features=out_features)


MODELS.register("gp", [
    Param("kernel", str, "rbf", choices=GP_KERNELS), Param("mixtures", int, 4, doc="sm: Q", **_pos),
    Param("restarts", int, 10, doc="sm: initial draws tried, the likeliest kept", **_pos),
    Param("ard", bool, True, doc="rbf: one length-scale per input (false: one for all)"),
])(_gp)

MODELS.register("lstm", [
    Param("activation", str, "sigmoid", choices=("sigmoid", "tanh")), Param("bias", bool, False),
], doc="Transformer Networks LSTM, Eqs. 13-18")(TNLSTM)

MODELS.register("ablated_lstm", [
    Param("activation", str, "sigmoid", choices=("sigmoid", "tanh")), Param("bias", bool, False),
], doc="Transformer Networks ablated LSTM, Eqs. 20-21")(AblatedLSTM)

from kernel_attention.models.node_classifier import NodeClassifier  # noqa: E402

__all__.append("NodeClassifier")
MODELS.register("node_classifier", [
    Param("hidden", int, 8, **_pos), Param("heads", int, 8, **_pos), Param("out_heads", int, 1, **_pos),
    Param("dropout", float, 0.6, **_prob),
    Param("kernel", (str, dict), "gat", doc="'gat', 'gat-kernel' or a positive implicit kernel (a spec)"),
    Param("negative_slope", float, 0.2),
], doc="two-layer GAT node classifier (8 heads x 8 hidden, ELU, dropout 0.6)")(NodeClassifier)
