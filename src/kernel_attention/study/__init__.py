"""Studies: one command per result table of the two papers (see /shared/papers/tables.md).

    kernel-attention study dissection-kernels --scale small --seeds 1 --out studies

A study is a grid of *cells* (:class:`~.core.Cell`: table, row, column, seed -> a normal run config), each
trained by the one Trainer in ``OUT/<study>/cells/<cell id>/`` (resumable; ``result.json`` marks it done
and a second invocation skips it).  Results are collected by the paper's protocol (TD: best validation of
N seeds -> its test score; IKA: mean ± std) into ``OUT/<study>/runs.csv`` (every run) and
``OUT/<study>/table.md`` (ours beside the paper's, and what the ``small`` scale shrank), with the papers'
figures in ``OUT/<study>/figures/``.

Modules: core (Cell, Study, TableSpec, registry), runner (cells, resume, progress), twins (equal cells train
once), carry (finished cells imported from a runs.csv), states (where each cell stands, ``--list``), report
(protocols, CSV, markdown), figures, probes (similarity/magnitude, attention capture), dissection / ika / smoke
(the studies), api (execute), revision (the code revision each cell records); the results page: findings (the
papers' comparisons as data), significance (paired differences and marks), resultset (a docs/results set and its
manifest), placeholders (numbers in prose), results_page (``kernel-attention study report``).
"""

from kernel_attention.study.api import execute
from kernel_attention.study.core import STUDIES, Cell, Study, StudyOptions, TableSpec, get_study, register_study
from kernel_attention.study import definitions  # noqa: F401  (registers the paper studies; core imports none)

__all__ = ["execute", "STUDIES", "Cell", "Study", "StudyOptions", "TableSpec", "get_study", "register_study",
           "study_names"]


def study_names() -> list[str]:
    return sorted(STUDIES)
