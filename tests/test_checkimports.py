"""Megatron imported for its argument check loads what the check calls (megalab/harness/checkimports.py): a lazy
package gives the same objects, imported when first asked for; a package whose __init__ does more is imported as
it is; in a fresh process the check's verdicts stand and torch.compile is given back."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from megalab.harness import checkimports

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def packages(tmp_path, monkeypatch):
    """top/ with a plain package (only from-imports of its submodules) and one whose __init__ does more."""
    top = tmp_path / "lazytop"
    for name, init in (("plain", '"""doc"""\nfrom lazytop.plain.heavy import Heavy\nfrom .light import Light, two as deux\n'),
                       ("busy", "from lazytop.busy.heavy import Heavy\nSETTING = 1\n")):
        pkg = top / name
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(init)
        (pkg / "heavy.py").write_text("import lazytop\nlazytop.LOADED.append(__name__)\nclass Heavy: pass\n")
        (pkg / "light.py").write_text("class Light: pass\ndef two(): return 2\n")
    (top / "__init__.py").write_text("LOADED = []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for m in [m for m in sys.modules if m.startswith("lazytop")]:
        del sys.modules[m]


def test_a_lazy_package_imports_each_name_from_its_submodule_when_first_asked_for(packages):
    assert checkimports.lazy_package("lazytop.plain")
    import lazytop
    import lazytop.plain as plain

    assert lazytop.LOADED == []  # the parent is imported, the package's heavy submodule is not
    from lazytop.plain import Light, deux

    assert deux() == 2 and Light.__module__ == "lazytop.plain.light" and lazytop.LOADED == []
    assert plain.Heavy.__module__ == "lazytop.plain.heavy" and lazytop.LOADED == ["lazytop.plain.heavy"]
    assert "Heavy" in dir(plain)
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        plain.Nothing  # noqa: B018
    assert not checkimports.lazy_package("lazytop.plain")  # imported already


def test_a_package_whose_init_does_more_or_is_missing_is_left_as_it_is(packages):
    assert not checkimports.lazy_package("lazytop.busy")
    assert not checkimports.lazy_package("lazytop.nothing")
    assert not checkimports.lazy_package("nosuchtop.pkg")
    assert "lazytop.busy" not in sys.modules


def test_the_check_in_a_fresh_process_loads_neither_inductor_nor_transformers_and_its_verdicts_stand():
    """Fresh Python (Megatron not imported yet): 101 accepted and a layout Megatron refuses refused, as without
    the light imports (the catalog's 240 plans gave the same verdicts both ways when this was written); neither
    Inductor (torch.compile's) nor transformers came in by the check's imports; torch.compile given back."""
    code = textwrap.dedent("""
        import json, sys
        import torch
        compile_ = torch.compile
        from megalab.core import catalog, plan
        from megalab.core.variables import Options
        from megalab.harness import validate
        p = plan.build(catalog.get("101"), Options(iters=5))
        validate.parser()
        out = {"transformers": "transformers" in sys.modules, "inductor": "torch._inductor" in sys.modules}
        validate.validate(p.entry_args, 1)
        out["transformers after"] = "transformers" in sys.modules
        try:
            validate.validate([*p.entry_args, "--tensor-model-parallel-size", "3"], 1)
            out["refused"] = None
        except validate.MegatronRejected as e:
            out["refused"] = str(e)
        out["compile restored"] = torch.compile is compile_
        print(json.dumps(out))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"transformers": False, "inductor": False, "transformers after": False,
                   "refused": out["refused"], "compile restored": True}
    assert out["refused"] == "world size (1) is not divisible by total_model_size (total_model_size=3)"
