"""Parts of the user's own by name in configs: ``run.imports`` imports the modules that register them, for every
command that reads the config, a checkpoint's stored one included."""

import sys

import pytest
import torch
import yaml

import kernel_attention as ka
from kernel_attention.cli import main
from kernel_attention.config import ConfigError
from kernel_attention.extensions import import_extensions
from kernel_attention.reference import smoother_loop

MODULE = '''
import torch.nn.functional as F
import kernel_attention as ka


@ka.KERNELS.register("test-cosine", [ka.Param("temperature", float, 0.1, check=lambda t: t > 0, rule="> 0")])
class CosineKernel(ka.Kernel):
    """exp(cos(a, b) / temperature)."""
    name = "test-cosine"

    def __init__(self, temperature: float = 0.1):
        super().__init__()
        self.temperature = temperature

    def log_kernel(self, q, k):
        return F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2) / self.temperature
'''

CONFIG = {
    "task": {"name": "synthetic", "kind": "copy", "vocab": 5, "min_len": 2, "max_len": 3, "batch_size": 8,
             "train_size": 16, "valid_size": 8, "test_size": 8},
    "model": {"d_model": 16, "n_heads": 2, "d_ff": 16, "enc_layers": 1, "dec_layers": 1, "dropout": 0.0,
              "encoder_attention": {"kernel": "test-cosine:temperature=0.2"}},
    "train": {"max_steps": 1, "progress": False},
}


@pytest.fixture
def cosine_module(tmp_path, monkeypatch):
    """my_kernels.py in a fresh working directory; the kernel it registers is gone again afterwards."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_kernels.py").write_text(MODULE)
    yield tmp_path
    ka.KERNELS._entries.pop("test-cosine", None)
    for name in [m for m in sys.modules if m == "my_kernels" or m.startswith("kernel_attention_extension_my_")]:
        del sys.modules[name]


def test_a_config_trains_and_a_checkpoint_loads_with_the_kernel_its_module_registers(cosine_module, capsys):
    (cosine_module / "run.yaml").write_text(yaml.safe_dump({"run": {"imports": ["my_kernels"]}, **CONFIG}))
    assert main(["train", "run.yaml", "--run-dir", "run"]) == 0
    loaded = ka.load("run")
    kernel = loaded.model.encoder[0].self_attn.kernel
    assert type(kernel).__name__ == "CosineKernel" and kernel.temperature == 0.2
    q, k, v = torch.randn(3, 1, 2, 5, 4, dtype=torch.float64).unbind(0)
    cos = torch.nn.functional.cosine_similarity
    ref = smoother_loop(q, k, v, lambda a, b: torch.exp(cos(a, b, dim=0) / 0.2))
    torch.testing.assert_close(ka.attention(q, k, v, kernel=kernel), ref)


def test_a_file_by_path_is_imported_once(cosine_module):
    assert import_extensions("my_kernels.py") == import_extensions(["my_kernels.py"])
    assert "test-cosine" in ka.KERNELS
    import_extensions("my_kernels")   # the same file under its module name: the same class, no clash
    with pytest.raises(ValueError, match=r"kernel 'test-cosine' is registered twice \(my_kernels.CosineKernel and "):
        ka.KERNELS.register("test-cosine")(type("CosineKernel", (ka.Kernel,), {}))


@pytest.mark.parametrize("imports, message", [
    ("nowhere", r"run.imports: no module 'nowhere' in the current directory \(.*\) or on the Python path"),
    ("nowhere.py", r"run.imports: nowhere.py is no file"),
    ([3], r"run.imports must be a module name or a .py file, or a list of them, got \[3\]"),
])
def test_a_module_that_is_not_there_is_named(tmp_path, monkeypatch, imports, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        import_extensions(imports)


def test_a_missing_dependency_of_the_module_is_its_own_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "needs_more.py").write_text("import no_such_dependency\n")
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency"):
        import_extensions("needs_more")


def test_check_names_a_part_of_your_own_as_not_checked(cosine_module, capsys):
    import_extensions("my_kernels")
    assert main(["check"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("kernel    test-cosine"))
    assert "a part of your own (registered outside the library): no reference here" in row


def test_mistakes_in_a_part_of_your_own_are_named():
    """What a kernel, filter or registration of one's own gets wrong is named where it happens, not averaged in."""
    q, k, v = torch.randn(3, 2, 2, 5, 4).unbind(0)
    with pytest.raises(TypeError, match="positive = False .* reads k itself from kernel"):
        class SquaredDot(ka.Kernel):  # k in log_kernel would be read as log k, exp(k) normalised
            positive = False

            def log_kernel(self, q, k):
                return (q @ k.transpose(-1, -2)) ** 2

    class OneBatchRow(ka.Kernel):
        name = "one-batch-row"

        def log_kernel(self, q, k):
            return (q @ k.transpose(-1, -2))[0]          # (H, Tq, Tk): broadcast over the batch, silently wrong

    class OneKey(ka.Kernel):
        name = "one-key"

        def log_kernel(self, q, k):
            return (q @ k.transpose(-1, -2))[..., :1]    # (B, H, Tq, 1): uniform weights, silently wrong

    for kernel, got in ((OneBatchRow(), r"\(2, 5, 5\)"), (OneKey(), r"\(2, 2, 5, 1\)")):
        for backend in ("auto", "dense", "blockwise"):
            with pytest.raises(ValueError, match=rf"kernel '{kernel.name}': log_kernel\(q, k\) gave {got}, not "
                                                 r"\(B, H, Tq, Tk\) = \(2, 2, 5, 5\)"):
                ka.attention(q, k, v, kernel=kernel, backend=backend)

    class FloatMask(ka.Filter):
        name = "float-mask"

        def mask(self, tq, tk, device=None, key_mask=None):
            return torch.ones(tq, tk).tril()

    with pytest.raises(ValueError, match=r"filter float-mask: mask\(5, 5\) gave torch.float32 \(5, 5\), not a bool"):
        ka.attention(q, k, v, mask=FloatMask())
    with pytest.raises(TypeError, match=r"Param 'temperature': the type comes second.*got 0.1"):
        ka.Param("temperature", 0.1)
    with pytest.raises(TypeError, match="kernel 'not-a-kernel': Plain is no subclass of Kernel"):
        ka.KERNELS.register("not-a-kernel")(type("Plain", (), {}))
    ka.KERNELS.register("test-factory")(lambda: "a string")
    try:
        with pytest.raises(TypeError, match="kernel 'test-factory': its factory gave a str, not a Kernel"):
            ka.make_kernel("test-factory")
    finally:
        ka.KERNELS._entries.pop("test-factory")


def test_a_run_stores_its_py_imports_by_absolute_path(cosine_module, tmp_path_factory, monkeypatch, capsys):
    (cosine_module / "run.yaml").write_text(yaml.safe_dump({"run": {"imports": ["my_kernels.py"]}, **CONFIG}))
    assert main(["train", "run.yaml", "--run-dir", "run"]) == 0
    stored = yaml.safe_load((cosine_module / "run" / "config.yaml").read_text())
    assert stored["run"]["imports"] == [str(cosine_module / "my_kernels.py")]
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    monkeypatch.chdir(elsewhere)
    (elsewhere / "in.txt").write_text("3 4 5\n")
    capsys.readouterr()
    assert main(["translate", str(cosine_module / "run"), "--input", "in.txt", "eval.beam=1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1
    assert main(["translate", str(cosine_module / "run"), "--input", "in.txt", "run.imports=gone.py"]) == 2
    assert "run.imports: gone.py is no file" in capsys.readouterr().err


def test_a_positional_scheme_of_your_own_adds_its_log_factor_and_a_wrong_return_is_named():
    class Alibi(ka.PositionScheme):
        """-|t_q - t_k| / 4 added to log k (ALiBi with one slope)."""

        name = "test-alibi"

        def terms(self, q, k, pos_q, pos_k, offset=None):
            dist = (pos_q[..., :, None, 0] - pos_k[..., None, :, 0]).abs().to(q.dtype)   # (Bp, Tq, Tk)
            return ka.PositionalTerms(bias=-dist[:, None] / 4)

    torch.manual_seed(0)
    layer = ka.KernelAttention(8, 2, position=Alibi(8, 2, 4)).double()
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    q, k, v, _ = layer.project(x, x, *[ka.positions.encodings.as_positions(torch.arange(5), 1)] * 2)
    t = torch.arange(5.0, dtype=torch.float64)
    logits = q @ k.transpose(-1, -2) / 2.0 - (t[:, None] - t[None, :]).abs() / 4
    want = layer.out_proj((torch.softmax(logits, -1) @ v).transpose(1, 2).reshape(1, 5, 8))
    torch.testing.assert_close(layer(x), want)      # exp kernel, 1/sqrt(d) = 1/2, plus the ALiBi factor

    class Wrong(ka.PositionScheme):
        name = "test-wrong"

        def terms(self, q, k, pos_q, pos_k, offset=None):
            return torch.zeros(q.shape[-2], k.shape[-2])

    with pytest.raises(TypeError, match=r"position 'test-wrong': terms\(\) gave a Tensor; it returns a Positional"):
        ka.KernelAttention(8, 2, position=Wrong(8, 2, 4))(x.float())
