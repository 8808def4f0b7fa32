import json
import math
import statistics

import pytest

from kernel_attention.data.protocols import (
    kfold_indices,
    mean_std,
    random_splits,
    seed_list,
    select_best,
    train_dev_split,
)


@pytest.mark.parametrize("n,k", [(10, 10), (23, 5), (101, 10)])
def test_kfold_disjoint_and_covering(n, k):
    folds = kfold_indices(n, k, seed=1)
    assert len(folds) == k
    tests = [set(f.test) for f in folds]
    for i in range(k):
        for j in range(i + 1, k):
            assert not tests[i] & tests[j]
        assert set(folds[i].train) | tests[i] == set(range(n)) and not set(folds[i].train) & tests[i]
        assert n // k <= len(tests[i]) <= n // k + 1
    assert sorted(x for t in tests for x in t) == list(range(n))


def test_kfold_seeded_and_stratified():
    a, b, c = kfold_indices(50, 5, seed=3), kfold_indices(50, 5, seed=3), kfold_indices(50, 5, seed=4)
    assert [f.test for f in a] == [f.test for f in b]
    assert [f.test for f in a] != [f.test for f in c]
    labels = [0] * 30 + [1] * 20  # sorted by class, like the .all files
    for f in kfold_indices(50, 5, seed=0, labels=labels):
        assert sum(labels[i] for i in f.test) == 4 and len(f.test) == 10
    with pytest.raises(TypeError, match="explicit integer seed"):
        kfold_indices(10, 2, seed=None)
    with pytest.raises(ValueError, match="2 <= k <= n"):
        kfold_indices(3, 5, seed=0)


def test_random_splits_match_ika_protocol():
    splits = random_splits(506, n_splits=10, train_fraction=0.9, seed=100)
    assert [s.seed for s in splits] == list(range(100, 110))
    for s in splits:
        assert len(s.train) == int(506 * 0.9) == 455 and len(s.test) == 51
        assert sorted(s.train + s.test) == list(range(506))
    assert random_splits(506, 3, 0.9, seed=100)[2].test == splits[2].test


def test_train_dev_split():
    s = kfold_indices(100, 10, seed=0)[0]
    t = train_dev_split(s, 0.1, seed=0)
    assert len(t.dev) == 9 and sorted(t.dev + t.train) == sorted(s.train) and t.test == s.test


def test_select_best_and_records_are_json():
    runs = [{"seed": s, "valid": v, "test": t} for s, v, t in zip(seed_list(7, 4), [30.1, 31.5, float("nan"), 31.5], [29.0, 30.2, 99.0, 30.9])]
    sel = select_best(runs, mode="max")
    assert (sel.best_index, sel.best_seed, sel.test) == (1, 8, 30.2)  # ties go to the earliest run, NaN never wins
    ppl = select_best([{"seed": 0, "valid": 25.0, "test": 26.0}, {"seed": 1, "valid": 24.0, "test": 27.0}], mode="min")
    assert ppl.best_seed == 1 and ppl.test == 27.0
    json.dumps(sel.to_dict(), allow_nan=True)
    json.dumps(kfold_indices(10, 2, seed=0)[0].to_dict())
    with pytest.raises(KeyError, match="'test'"):
        select_best([{"valid": 1.0}])


def test_mean_std_matches_statistics_module():
    v = [34.44, 34.51, 34.37]
    s = mean_std(v)
    assert math.isclose(s.mean, statistics.fmean(v)) and math.isclose(s.std, statistics.pstdev(v))
    assert math.isclose(mean_std(v, ddof=1).std, statistics.stdev(v))
    assert json.loads(json.dumps(s.to_dict()))["n"] == 3
    with pytest.raises(ValueError):
        mean_std([1.0], ddof=1)
