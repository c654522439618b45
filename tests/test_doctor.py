"""Every kit module imports with private torch objects removed (as a future torch may), and the feature that needs
one raises the doctor's one-line message naming the kit feature it breaks, instead of an ImportError at import."""
import subprocess, sys
CODE = '''
import torch.distributed.fsdp._flat_param as f, torch.distributed._tools.mem_tracker as mt
del f.FlatParameter; del mt.MemTracker
import pkgutil, importlib, lora_fsdp_kit
for m in pkgutil.iter_modules(lora_fsdp_kit.__path__):
    if not m.name.startswith("_"): importlib.import_module("lora_fsdp_kit." + m.name)
from lora_fsdp_kit.memory import _TimelineMemTracker
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
