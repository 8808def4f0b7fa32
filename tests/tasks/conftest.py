import pytest

from kernel_attention.training import TrainConfig, Trainer


@pytest.fixture
def train(tmp_path):
    """train(task, steps, **config) -> (trainer, summary): a short run in a temporary directory."""
    def run(task, steps, **kw):
        cfg = TrainConfig(max_steps=steps, progress=False, test_best=False, **kw)
        trainer = Trainer(task, cfg, tmp_path / "run")
        return trainer, trainer.fit()
    return run
