"""`kernel-attention run` prints its markdown table (a few steps only; the real run is in the report), and stops
at once on Ctrl-C or SIGTERM."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kernel_attention.cli import main
from kernel_attention.cli.run import GRID


def test_run_prints_one_row_per_grid_point(capsys):
    assert main(["run", "--steps", "2", "--jobs", "1", "--test-size", "8"]) == 0
    out = capsys.readouterr().out
    rows = [l for l in out.splitlines() if l.startswith("| ") and not l.startswith("| kernel")]
    assert len(rows) == len(GRID)
    assert {r.split("|")[1].strip() for r in rows} == {"exp", "rbf", "linear"}
    assert "wall time" in out


def _as_in_a_terminal():
    """SIGINT's default, as a command typed in a terminal has it (a shell starts background jobs, and nohup its
    command, with SIGINT ignored, which the test run may inherit)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _children(pid: int) -> set[int]:
    try:
        return {int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads a process's children from /proc")
@pytest.mark.parametrize("signame,status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_stops_the_whole_grid_and_its_workers_at_once(tmp_path, signame, status):
    """Ctrl-C (SIGINT to the command's process group, as a terminal sends it) or SIGTERM during the workers' runs:
    the command exits with 128 + the signal, its workers with it, and does not go on to the rest of the grid
    (here far longer than the wait)."""
    code = "import sys; from kernel_attention.cli import main; sys.exit(main())"
    proc = subprocess.Popen([sys.executable, "-c", code, "run", "--steps", "100000", "--test-size", "8"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            cwd=tmp_path, preexec_fn=_as_in_a_terminal)
    try:
        deadline = time.monotonic() + 120
        while len(workers := _children(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(workers) == 2, "the two workers did not start"
        time.sleep(1.0)  # into their runs
        os.killpg(proc.pid, getattr(signal, signame))
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == status, err
    assert "kernel-attention run: interrupted: the grid stopped" in err and "Traceback" not in err, err
    assert not out
    assert not any(Path(f"/proc/{w}").exists() for w in workers)


def test_a_signal_stops_a_run_in_this_process_at_once_not_at_its_next_checkpoint(capsys):
    """With ``--jobs 1`` the runs train in the command's process: the signal stops the run where it is (no
    checkpoint to write for a demo), not at the trainer's next logged step."""
    from kernel_attention.cli import run as run_command

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    done = threading.Event()

    def press():  # Ctrl-C after 2 s, again each second while the run's handler is in place: a signal whose
        done.wait(2.0)  # handler runs inside a __del__ during garbage collection is swallowed there
        while not done.is_set():
            if signal.getsignal(signal.SIGINT) is run_command._stop:
                os.kill(os.getpid(), signal.SIGINT)
            done.wait(1.0)

    presser = threading.Thread(target=press, daemon=True)
    presser.start()
    try:
        assert main(["run", "--steps", "100000", "--jobs", "1", "--test-size", "8"]) == 130
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    finally:
        done.set()
        presser.join()
        signal.signal(signal.SIGINT, before)
    err = capsys.readouterr().err
    assert "interrupted: the grid stopped" in err and "last.pt" not in err, err
