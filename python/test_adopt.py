"""CPU tests of python/adopt/sitecustomize.py: it chains the sitecustomize it hides,
stays out of the way without CUDAMEM_TORCH_POLICY, and never stops the program when
the backend cannot be installed (here: a `torch` stub that is no PyTorch)."""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ADOPT = os.path.join(HERE, "adopt")


def run(code, env_extra, extra_path):
    env = dict(os.environ)
    env.pop("CUDAMEM_TORCH_POLICY", None)
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join([ADOPT] + extra_path)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


class Adoption(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        with open(os.path.join(self.tmp.name, "sitecustomize.py"), "w") as f:
            f.write("import os\nos.environ['CHAINED'] = 'yes'\n")
        os.mkdir(os.path.join(self.tmp.name, "torch"))
        with open(os.path.join(self.tmp.name, "torch", "__init__.py"), "w") as f:
            f.write("LOADED = True\n")

    def test_the_hidden_sitecustomize_still_runs(self):
        p = run("import os; print(os.environ.get('CHAINED'))", {}, [self.tmp.name])
        self.assertEqual(p.stdout.strip(), "yes", p.stderr)

    def test_without_a_policy_torch_is_left_alone(self):
        p = run("import torch; print(torch.LOADED)", {}, [self.tmp.name])
        self.assertEqual((p.returncode, p.stdout.strip(), p.stderr), (0, "True", ""))

    def test_a_failed_install_says_why_and_the_program_goes_on(self):
        p = run("import torch, os; print(torch.LOADED, os.environ['CUDAMEM_POLICY'])",
                {"CUDAMEM_TORCH_POLICY": "stitch", "CUDAMEM_TORCH_LIB": "/nonexistent/lib.so"},
                [self.tmp.name])
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.strip(), "True stitch")
        self.assertIn("not installed, the program runs on PyTorch's allocator", p.stderr)


if __name__ == "__main__":
    unittest.main()
