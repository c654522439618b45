"""Every kit module imports with private torch objects removed (as a future torch may), and the feature that needs
one raises the doctor's one-line message naming the kit feature it breaks, instead of an ImportError at import."""
import subprocess, sys
CODE = '''
import torch.distributed.fsdp._flat_param as f, torch.distributed._tools.mem_tracker as mt
del f.FlatParameter; del mt.MemTracker
import pkgutil, importlib, lora_fsdp_kit
for m in pkgutil.walk_packages(lora_fsdp_kit.__path__, "lora_fsdp_kit."):
    if not m.name.rsplit(".", 1)[1].startswith("_"): importlib.import_module(m.name)
from lora_fsdp_kit.memory.core import _TimelineMemTracker
try: _TimelineMemTracker(lambda n: None)
except Exception as e: print(type(e).__name__, e)
from lora_fsdp_kit.doctor import doctor
print(doctor(models=False))
'''
def test_kit_imports_without_the_internals():
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "KitCompatibilityError" in r.stdout and "breaks CPU peak-memory timeline" in r.stdout, r.stdout[-2000:]
    assert "FlatParameter" in r.stdout and "MemTracker" in r.stdout, r.stdout[-2000:]   # the doctor names both

def test_the_doctor_reports_the_platform(tmp_path, monkeypatch, capsys):
    # `lfk doctor` stopped at a forced platform it cannot use or a broken plugin with one line (exit 2) before its report,
    # and `python -m lora_fsdp_kit.doctor` said nothing of either (exit 0); a plugin calling sys.exit(0) on import
    # ended any command silently with exit 0 (in this process: each entry point's `main`, as `-m` runs it)
    from lora_fsdp_kit import doctor as D
    from lora_fsdp_kit.__main__ import main as lfk
    (tmp_path/"lfk_exitplug.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    def run(main, args, **env):
        with monkeypatch.context() as m:
            for k, v in env.items(): m.setenv(k, v)
            code = main(args)
        out = capsys.readouterr(); return code, out.out, out.err
    for main, args in ((lfk, ["doctor", "--no-models"]), (D.main, ["--no-models"])):
        code, out, err = run(main, args, LFK_PLATFORM="bogus")
        assert code == 1 and "PROBLEM: platform: LFK_PLATFORM='bogus' is not a registered platform" in out, (code, out, err)
    code, out, err = run(lfk, ["doctor", "--no-models"], LFK_PLUGINS="lfk_exitplug")
    assert code == 1 and "PROBLEM: platform: plugin 'lfk_exitplug'" in out, (code, out, err)
    code, out, err = run(lfk, ["plan", "--config", "llama"], LFK_PLUGINS="lfk_exitplug")
    assert code == 2 and "plugin 'lfk_exitplug' (from $LFK_PLUGINS) failed to load: SystemExit: 0" in err, (code, err)
