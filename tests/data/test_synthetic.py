import pytest
import torch

from kernel_attention.data.synthetic import BOS_ID, EOS_ID, PAD_ID, SYNTHETIC
from kernel_attention.registry import SpecError

SMALL = "n_train=50,n_valid=10,n_test=10"


def _body(t):
    assert t[-1] == EOS_ID and EOS_ID not in t[:-1].tolist()
    return t[:-1].tolist()


def test_names_and_determinism():
    assert {"copy", "reverse", "sort", "recall", "translate"} <= set(SYNTHETIC.names())
    for name in ["copy", "reverse", "sort", "recall", "translate"]:
        a, b = SYNTHETIC.create(f"{name}:{SMALL}"), SYNTHETIC.create(f"{name}:{SMALL}")
        c = SYNTHETIC.create(f"{name}:{SMALL},seed=1")
        for split, n in [("train", 50), ("valid", 10), ("test", 10)]:
            assert len(a[split]) == n
            assert all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a[split], b[split]))
        assert any(not torch.equal(x[0], y[0]) for x, y in zip(a["train"], c["train"]))
        srcs = [tuple(s.tolist()) for split in ("train", "valid", "test") for s, _ in a[split]]
        assert len(set(srcs)) == len(srcs)  # no source shared between splits
        for s, t in a["train"]:
            assert min(_body(s) + _body(t)) >= 3 and max(s.max(), t.max()) < a.vocab_size


def test_copy_reverse_sort_targets():
    for name, f in [("copy", lambda x: x), ("reverse", lambda x: x[::-1]), ("sort", sorted)]:
        d = SYNTHETIC.create(f"{name}:length=7,min_length=3,vocab=12,{SMALL}")
        lengths = set()
        for s, t in d["train"]:
            x = _body(s)
            lengths.add(len(x))
            assert _body(t) == list(f(x))
        assert lengths <= set(range(3, 8)) and len(lengths) > 1


def test_recall_target_is_the_value_of_the_query_key():
    d = SYNTHETIC.create(f"recall:pairs=3,vocab=15,{SMALL}")
    for s, t in d["train"]:
        x = _body(s)
        keys, values, q = x[0:6:2], x[1:6:2], x[6]
        assert len(set(keys)) == 3 and q in keys
        assert all(k < 3 + 6 <= v for k, v in zip(keys, values))  # keys and values drawn from disjoint halves
        assert _body(t) == [values[keys.index(q)]]


def test_translate_is_dictionary_plus_block_reversal():
    d = SYNTHETIC.create(f"translate:length=8,vocab=10,block=3,{SMALL}")
    lex = d.lexicon
    assert sorted(lex[3:].tolist()) == list(range(3, 10)) and lex[:3].tolist() == [0, 1, 2]
    for s, t in d["train"]:
        x, y = _body(s), _body(t)
        # blocks [0,1,2] [3,4,5] [6,7] reversed: target position j reads source position perm[j]
        perm = [2, 1, 0, 5, 4, 3, 7, 6]
        assert y == [int(lex[x[p]]) for p in perm]
    # the same seed gives the same dictionary whatever the sizes
    assert torch.equal(SYNTHETIC.create("translate:n_train=5,n_valid=1,n_test=1").lexicon,
                       SYNTHETIC.create("translate:n_train=9,n_valid=2,n_test=2").lexicon)


def test_batches_padding_shuffle_and_sharding():
    d = SYNTHETIC.create(f"copy:length=6,min_length=2,{SMALL}")
    bs = list(d.batches("train", 8))
    assert len(bs) == 7 and bs[-1][0].shape[0] == 2
    src, tgt = bs[0]
    for i in range(8):
        s, _ = d["train"][i]
        assert src[i, : len(s)].tolist() == s.tolist() and (src[i, len(s):] == PAD_ID).all()
    e0 = [b[0] for b in d.batches("train", 8, shuffle=True, seed=1, epoch=0)]
    e0b = [b[0] for b in d.batches("train", 8, shuffle=True, seed=1, epoch=0)]
    e1 = [b[0] for b in d.batches("train", 8, shuffle=True, seed=1, epoch=1)]
    assert all(torch.equal(a, b) for a, b in zip(e0, e0b))
    assert not all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(e0, e1))
    r0 = list(d.batches("train", 8, rank=0, world_size=2))
    r1 = list(d.batches("train", 8, rank=1, world_size=2))
    assert len(r0) == 4 and len(r1) == 3 and torch.equal(r1[0][0], bs[1][0])
    assert len(list(d.batches("train", 8, drop_last=True))) == 6
    assert (d.pad_id, d.bos_id, d.eos_id) == (PAD_ID, BOS_ID, EOS_ID) == (0, 1, 2)


def test_errors():
    with pytest.raises(SpecError, match="accepted: copy, recall, reverse, sort, translate"):
        SYNTHETIC.create("revers")
    with pytest.raises(SpecError, match="no parameter lenght"):
        SYNTHETIC.create("copy:lenght=3")
    with pytest.raises(ValueError, match="distinct keys need vocab >= 13"):
        SYNTHETIC.create("recall:pairs=5,vocab=12")
    with pytest.raises(ValueError, match="cannot draw"):
        SYNTHETIC.create("copy:length=1,vocab=5,n_train=5,n_valid=1,n_test=1")
    with pytest.raises(ValueError, match="min_length=5 > length=3"):
        SYNTHETIC.create("copy:length=3,min_length=5")


def test_every_rank_gets_as_many_training_batches():
    """125 batches over 2 ranks: 62 each (the 125th goes), so that the ranks leave each epoch at the same step."""
    from kernel_attention.tasks.synthetic import SyntheticSeq2SeqTask

    task = SyntheticSeq2SeqTask(kind="copy", vocab=10, min_len=4, max_len=8, batch_size=16, train_size=2000,
                                valid_size=8, test_size=8)
    counts = [sum(1 for _ in task.train_batches(0, rank, 2)) for rank in (0, 1)]
    assert counts == [62, 62] == [task.num_batches(0, rank, 2) for rank in (0, 1)]
    assert sum(1 for _ in task.train_batches(0, 0, 1)) == task.num_batches(0, 0, 1) == 125
