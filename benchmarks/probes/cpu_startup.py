"""Start-up cost of the CPU kernels: ``import rmsnorm``, the first forward + backward in a process
with an empty numba cache (compilation), and in a second process (loaded from the cache).

    PYTHONPATH=src python benchmarks/probes/cpu_startup.py [--as-user nobody]

Each measurement runs in a fresh interpreter on a private copy of the package, so the repository's
own cache is neither used nor touched. With ``--as-user`` (as root) the copy is read-only to that
user, as in a system-wide install, and numba falls back to its per-user cache directory under $HOME.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter(); c0 = time.process_time()
import torch
t1 = time.perf_counter()
import rmsnorm
t2 = time.perf_counter()
numba_at_import = "numba" in sys.modules
x = torch.randn(64, 512, requires_grad=True)
w = torch.randn(512, requires_grad=True)
t3 = time.perf_counter()
y = rmsnorm.rms_norm(x, 512, w)
t4 = time.perf_counter()
y.sum().backward()
t5 = time.perf_counter()
import numba
print(json.dumps({
    "import_torch_s": t1 - t0, "import_rmsnorm_s": t2 - t1,
    "numba_imported_by_import": numba_at_import,
    "first_forward_s": t4 - t3, "first_backward_s": t5 - t4, "cpu_s": time.process_time() - c0,
    "cache_dir_config": numba.config.CACHE_DIR,
}))
"""


def _run(pkg_root: Path, env: dict, user: str | None) -> dict:
    cmd = [sys.executable, "-c", _CHILD]
    if user:
        import pwd

        pw = pwd.getpwnam(user)
        cmd = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", *cmd]
    res = subprocess.run(cmd, env=env, cwd=pkg_root, capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        raise SystemExit(res.stderr)
    return json.loads(res.stdout.strip().splitlines()[-1])


def _cache_files(*roots: Path) -> list[str]:
    return sorted(
        str(p)
        for root in roots
        if root.exists()
        for p in root.rglob("*")
        if p.suffix in (".nbi", ".nbc")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--as-user", help="run the children as this user (needs root), package read-only"
    )
    args = ap.parse_args()
    src = Path(__file__).resolve().parents[2] / "src" / "rmsnorm"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shutil.copytree(src, tmp / "pkg" / "rmsnorm", ignore=shutil.ignore_patterns("__pycache__"))
        home = tmp / "home"
        home.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
        env.update(PYTHONPATH=str(tmp / "pkg"), HOME=str(home), PYTHONDONTWRITEBYTECODE="1")
        if args.as_user:
            import pwd

            pw = pwd.getpwnam(args.as_user)
            os.chown(home, pw.pw_uid, pw.pw_gid)
            os.chmod(tmp, 0o755)
            for p in (tmp / "pkg").rglob("*"):
                os.chmod(p, 0o555 if p.is_dir() else 0o444)
        cold = _run(tmp / "pkg", env, args.as_user)
        files = _cache_files(tmp / "pkg", home)
        warm = _run(tmp / "pkg", env, args.as_user)
        print(json.dumps({"cold": cold, "warm": warm, "cache_files": files}, indent=1))


if __name__ == "__main__":
    main()
