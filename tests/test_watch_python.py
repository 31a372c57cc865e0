"""``jaxwise watch SCRIPT`` behaves as ``python SCRIPT`` (subprocesses, so marked slow).

Absolute ``__file__`` and traceback paths, no watch frames in a traceback, Ctrl-C printing
Python's traceback and dying by SIGINT, and NumPy's global random state as plain Python leaves
it after ``import jax`` (a script that seeds NumPy, then imports jax, prints the same numbers).
"""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

JAXWISE = os.path.join(os.path.dirname(sys.executable), "jaxwise")


def _both(tmp_path, source):
    """``(plain, watched)`` completed processes of the same script, run from ``tmp_path``."""
    (tmp_path / "sub").mkdir(exist_ok=True)
    (tmp_path / "sub" / "script.py").write_text(textwrap.dedent(source).lstrip())

    def run(command):
        return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)

    plain = run([sys.executable, "sub/script.py"])
    watched = run([JAXWISE, "watch", "sub/script.py"])
    return plain, watched


def test_a_script_seeding_numpy_before_importing_jax_prints_the_same_numbers(tmp_path):
    plain, watched = _both(
        tmp_path,
        """
        import numpy as np
        np.random.seed(0)
        import jax
        print(np.random.rand(3).tolist(), np.random.randint(1000))
        """,
    )
    assert plain.returncode == watched.returncode == 0, watched.stderr
    assert plain.stdout == watched.stdout


def test_file_and_traceback_paths_are_absolute_and_without_watch_frames(tmp_path):
    plain, watched = _both(
        tmp_path,
        """
        import jax, jax.numpy as jnp
        print(__file__)
        f = jax.jit(lambda x: x.reshape(7))
        f(jnp.ones(3))
        """,
    )
    assert plain.returncode == watched.returncode == 1
    assert plain.stdout == watched.stdout == f"{tmp_path / 'sub' / 'script.py'}\n"
    assert f'File "{tmp_path / "sub" / "script.py"}", line 4, in <module>' in watched.stderr
    assert "jaxwise" + os.sep + "watch" not in watched.stderr
    assert "TypeError: cannot reshape array" in watched.stderr


def test_ctrl_c_prints_the_traceback_and_dies_by_sigint(tmp_path):
    plain, watched = _both(
        tmp_path,
        """
        import atexit, os, signal
        import jax, jax.numpy as jnp
        atexit.register(lambda: print("exit handler ran"))
        f = jax.jit(lambda x: x + 1)
        f(jnp.ones(2))
        def interrupted():
            os.kill(os.getpid(), signal.SIGINT)
        interrupted()
        """,
    )
    assert plain.returncode == watched.returncode == -signal.SIGINT
    assert plain.stdout == watched.stdout == "exit handler ran\n"
    tail = "in interrupted\n    os.kill(os.getpid(), signal.SIGINT)\nKeyboardInterrupt\n"
    assert plain.stderr.endswith(tail)
    assert tail in watched.stderr
    assert watched.stderr.index(tail) < watched.stderr.index("jaxwise watch:")  # then the report


def test_argv_and_main_module_as_python_gives_them(tmp_path):
    """``sys.argv[0]`` as typed (runpy would make it absolute), ``__file__`` absolute."""
    plain, watched = _both(
        tmp_path,
        """
        import os, pickle, sys

        class Point:
            pass

        print(sys.argv, os.path.isabs(__file__), __name__, __spec__, __package__)
        print(type(__loader__).__name__, len(pickle.dumps(Point())) > 0)
        """,
    )
    assert plain.returncode == watched.returncode == 0, watched.stderr
    assert plain.stdout == watched.stdout
    assert watched.stdout.startswith("['sub/script.py'] True __main__ None None\n")
