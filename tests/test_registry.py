"""The registry: one vocabulary for API, configs and CLI; typed parameters; clear errors."""

import pytest

import kernel_attention as ka
from kernel_attention.registry import Param, Registry, SpecError, parse_spec


def test_spec_forms_are_equivalent():
    forms = ["poly:degree=3", {"name": "poly", "degree": 3}, ("poly", {"degree": 3})]
    assert all(ka.KERNELS.validate(f) == ("poly", {"degree": 3}) for f in forms)
    assert ka.make_kernel("poly:degree=3").degree == 3
    k = ka.make_kernel("exp")
    assert ka.make_kernel(k) is k


def test_parse_spec_errors():
    with pytest.raises(SpecError, match="key=value"):
        parse_spec("poly:degree")
    with pytest.raises(SpecError, match="'name'"):
        parse_spec({"degree": 2})
    with pytest.raises(SpecError, match="cannot read spec"):
        parse_spec(3)
    with pytest.raises(SpecError, match="parameter 'scale' is given twice in 'rbf:scale=1,scale=2'"):
        parse_spec("rbf:scale=1,scale=2")


def test_typed_parameters():
    reg = Registry("thing")

    @reg.register("t", [Param("n", int, 1, check=lambda x: x > 0, rule="> 0"), Param("x", float, 0.5),
                        Param("flag", bool, False), Param("mode", str, "a", choices=("a", "b")),
                        Param("opt", int, None, optional=True)])
    def make(n, x, flag, mode, opt):
        return (n, x, flag, mode, opt)

    assert reg.create("t:n=3,x=2,flag=true,mode=b") == (3, 2.0, True, "b", None)
    assert reg.create({"name": "t", "x": 1}) == (1, 1.0, False, "a", None)
    for bad, msg in [("t:n=0", "> 0"), ("t:n=1.5", "cannot read"), ("t:mode=c", "not one of"),
                     ({"name": "t", "n": True}, "boolean"), ("t:flag=maybe", "cannot read"), ("u", "unknown thing 'u'")]:
        with pytest.raises(SpecError, match=msg):
            reg.create(bad)
    reg.register("t")(make)   # the same function again (its module imported again): no clash
    with pytest.raises(ValueError, match=r"thing 't' is registered twice \(.*make and .*<lambda>\)"):
        reg.register("t")(lambda: None)


def test_context_reaches_only_factories_that_name_it():
    reg = Registry("thing")
    reg.register("plain")(lambda: "plain")
    reg.register("sized")(lambda n_heads: n_heads)
    assert reg.create("plain", n_heads=4) == "plain"
    assert reg.create("sized", n_heads=4) == 4


def test_vocabulary_lists_every_name():
    from kernel_attention.vocabulary import REGISTRIES, describe_vocabulary

    text = describe_vocabulary()
    for reg in REGISTRIES.values():
        for name in reg.names():
            assert name in text


def test_every_name_has_a_summary_that_ends_where_a_sentence_or_phrase_does():
    """The vocabulary's one line per name (``--help``, ``check``) is the first paragraph of its docstring: never
    empty, never cut where the source broke a sentence before a formula."""
    from kernel_attention.vocabulary import REGISTRIES

    for reg in REGISTRIES.values():
        for name in reg.names():
            doc = reg.entry(name).doc.rstrip()
            assert doc and not doc.endswith((",", " with", " and", " of", " the", " by")), (reg.kind, name, doc)


def test_the_package_exports_every_public_name_it_imports():
    # ``from kernel_attention import *`` gives what ``ka.NAME`` gives (explain, choose_backend included).
    import types
    public = {n for n, v in vars(ka).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert public == set(ka.__all__) - {"__version__"}


def test_the_factories_take_a_parts_parameters_as_keywords():
    assert ka.make_kernel("rbf", scale=0.3).scale == 0.3 and ka.make_kernel("poly", degree=3).degree == 3
    ikan = ka.make_kernel("ikan", n_heads=2, d_head=8, R=4)
    assert ikan.hparams()["R"] == 4
    assert repr(ka.make_filter("local", window=2)) == repr(ka.make_filter("local:window=2"))
    shaw = ka.positions.make_position("shaw", d_model=8, n_heads=2, d_head=4, clip=3)
    assert shaw.clip == 3
    with pytest.raises(ka.SpecError, match=r"kernel 'rbf' has no parameter foo; accepted: scale.* \(and n_heads, "
                                           r"d_head, the sizes of the layer\)"):
        ka.make_kernel("rbf", foo=1)
    with pytest.raises(ka.SpecError, match="kernel 'rbf': scale is given in the spec and as a keyword"):
        ka.make_kernel("rbf:scale=0.2", scale=0.3)
    with pytest.raises(ka.SpecError, match="filter 'local' has no parameter size; accepted: window"):
        ka.make_filter("local", size=2)
    with pytest.raises(ka.SpecError, match="go with one filter's name"):
        ka.make_filter("causal&local", window=2)


@pytest.mark.parametrize("spec", ["rbf-only:lengthscale=inf", "exp:scale=nan", "rbf:scale=-inf"])
def test_a_number_that_is_not_finite_is_refused(spec):
    with pytest.raises(ka.SpecError, match=r"must be a finite number"):
        ka.make_kernel(spec, n_heads=2, d_head=4)
