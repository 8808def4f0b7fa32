"""Model-agnostic training machinery.

    task.py          Task: the interface a task family implements (build_model, train_batches, loss, evaluate)
    loop.py          Trainer: one loop (AdamW/Adam, schedules, clipping, accumulation, AMP,
                     DDP, evaluation, checkpoints, exact resume, metrics.jsonl, tqdm)
    config.py        TrainConfig (the ``train:`` section of a config) and seed_everything
    optimizer.py     Adam / AdamW, fused where the device has it; loading a state written by either implementation
    schedules.py     SCHEDULES registry: constant, inverse_sqrt (fairseq), cosine (Transformer-XL)
    run_log.py       metrics.jsonl (and TensorBoard): append, read, cut back to a checkpoint on resume
    checkpoint.py    atomic last.pt / best.pt with RNG states and data position
    averaging.py     step_<k>.pt snapshots (train.keep_last) and the mean of their weights
    distributed.py   torchrun env -> process group (gloo on CPU, nccl on GPU), DDP, rank-0 helpers
    metrics.py       perplexity, BLEU (detokenised sacreBLEU / tokenised fairseq-style), accuracy, RMSE
    decoding.py      greedy and beam search over a model-agnostic step function
"""

from kernel_attention.training.checkpoint import load_checkpoint, save_checkpoint
from kernel_attention.training.config import TrainConfig, seed_everything
from kernel_attention.training.loop import Trainer
from kernel_attention.training.run_log import read_metrics
from kernel_attention.training.schedules import SCHEDULES
from kernel_attention.training.task import Task, unwrap

__all__ = ["Task", "unwrap", "TrainConfig", "Trainer", "read_metrics", "seed_everything", "SCHEDULES",
           "save_checkpoint", "load_checkpoint"]
