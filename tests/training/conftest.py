import os
import sys

# Tests here share the toy task in _toy_task.py; pytest's importlib mode does not put this folder on
# sys.path, so do it once for them (spawned DDP workers re-import their test module and get the same).
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
