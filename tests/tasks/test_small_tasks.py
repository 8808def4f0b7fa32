"""Classification, regression and node classification end to end on in-memory data."""

import pytest
import torch

from kernel_attention.data import ClassificationData, GraphData, RegressionData
from kernel_attention.registry import SpecError
from kernel_attention.tasks import build_task


def test_classification_learns_a_keyword_rule(train):
    g = torch.Generator().manual_seed(0)
    words = "good bad movie plot actor scene long short".split()
    texts, labels = [], []
    for i in range(200):
        w = [words[int(j)] for j in torch.randint(2, 8, (5,), generator=g)]
        lab = i % 2
        w.insert(int(torch.randint(0, 5, (1,), generator=g)), "good" if lab else "bad")
        texts.append(" ".join(w))
        labels.append(lab)
    ds = ClassificationData("toy", texts, torch.tensor(labels), 2, {}, {})
    task = build_task({"task": {"name": "classification", "batch_size": 20, "folds": 5},
                       "data": {"dataset": ds},
                       "model": {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1, "dropout": 0.0,
                                 "attention": {"kernel": "rbf"}}})
    trainer, _ = train(task, 40, lr=1e-2)
    m = trainer.evaluate("test")
    assert m["accuracy"] > 0.9


def test_regression_uses_only_training_rows_in_the_loss(train):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 3, generator=g, dtype=torch.float64)
    y = (x[:, :1] * 2 - x[:, 1:2]).double()
    ds = RegressionData("toy", x, y, ["a", "b", "c"], "y")
    task = build_task({"task": {"name": "regression", "scale": "standard"}, "data": {"dataset": ds},
                       "model": {"d_model": 16, "n_heads": 8}})
    model = task.build_model()
    batch = next(iter(task.train_batches(0)))
    assert batch["x"].shape == (1, 120, 3)                   # the whole dataset is one sequence
    with torch.no_grad():
        before = task.evaluate(model.eval(), "test")["rmse"]
    # poisoning test targets does not change the training loss
    loss1, _ = task.loss(model.eval(), batch)
    batch2 = dict(batch, y=batch["y"].clone())
    test_idx = task.index["test"]
    batch2["y"][:, test_idx] += 100.0
    loss2, _ = task.loss(model, batch2)
    torch.testing.assert_close(loss1, loss2)
    trainer, _ = train(task, 60, lr=1e-2)
    after = trainer.evaluate("test")["rmse"]
    assert after < before and after < float(y.std())
    with torch.no_grad():  # the paper's units: the scaled target's, as the studies convert with unit_factor
        m = task.evaluate(trainer.model.eval(), "test")
    assert m["rmse_scaled"] == pytest.approx(m["rmse"] / float(y[task.index["train"]].std(unbiased=False)), rel=1e-6)


def test_node_classification_on_two_communities(train):
    g = torch.Generator().manual_seed(0)
    n = 40
    y = torch.arange(n) % 2
    x = torch.randn(n, 6, generator=g) * 0.5 + y[:, None].float()
    src, dst = [], []
    for i in range(n):
        for j in range(i + 2, n, 2):                           # edges inside each community
            if torch.rand(1, generator=g) < 0.3:
                src += [i, j]
                dst += [j, i]
    edges = torch.tensor([src, dst])
    masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
    masks[0][:20], masks[1][20:30], masks[2][30:] = True, True, True
    ds = GraphData("toy", x, y, edges, *masks, num_classes=2)
    task = build_task({"task": "node_classification", "data": {"dataset": ds},
                       "model": {"hidden": 4, "heads": 2, "dropout": 0.1}})
    trainer, _ = train(task, 30, lr=1e-2)
    assert trainer.evaluate("test")["accuracy"] >= 0.9
    w = trainer.model.attention_maps(x, edges)
    assert len(w) == 2


def test_bad_configs_of_small_tasks():
    with pytest.raises(SpecError, match="scale.*not one of"):
        build_task({"task": {"name": "regression", "scale": "log"}, "data": {"dataset": "concrete"}})
    with pytest.raises(SpecError, match="unknown dataset 'imdb'"):
        build_task({"task": "classification", "data": {"dataset": "imdb"}})
    with pytest.raises(SpecError, match=r"fold=10 must be in \[0, folds=10\)"):  # an IndexError at the first batch
        build_task({"task": {"name": "classification", "fold": 10}, "data": {"dataset": "mr"}})
    with pytest.raises(SpecError, match="does not fit this task; accepted: classifier"):
        build_task({"task": "classification", "data": {"dataset": "mr"}, "model": {"name": "regressor"}})
