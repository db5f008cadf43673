"""rankstream's bootstrap: ``rankstream run`` puts this directory first on PYTHONPATH.

Python imports ``sitecustomize`` at start-up in every process of the job (the launcher, its agent,
the ranks, DataLoader workers). This one first runs the ``sitecustomize`` it hides (Debian ships
one), then only registers a hook on ``torch.distributed.init_process_group``: rankstream starts in
the processes that create a process group, and nothing heavy is imported anywhere else.
"""

import importlib
import os
import sys


def _run_the_hidden_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != here]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    except Exception as exc:  # their bug must not stop the job, nor hide ours
        print(f"rankstream: the sitecustomize this one hides failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        sys.path[:] = saved
        if ours is not None:
            sys.modules["sitecustomize"] = ours


_run_the_hidden_sitecustomize()
try:
    from rankstream.autostart import install

    install()
except Exception as exc:  # rankstream cannot start here: the job still runs, with one warning
    print(f"rankstream: not capturing this process: {type(exc).__name__}: {exc}", file=sys.stderr)
