"""Which of a launcher's descendant processes are its ranks, whichever way `launch` started them."""
import psutil

def _line(p:psutil.Process)->str:
    try: return " ".join(p.cmdline())
    except psutil.Error: return ""

def rank_processes(family:list[psutil.Process])->list[psutil.Process]:
    "The ranks among `family`: spawned ones (`spawn_main`), or the children of the fork server."
    def is_rank(p):
        if "spawn_main" in _line(p): return True
        try: parent = p.parent()
        except psutil.Error: return False
        return parent is not None and "multiprocessing.forkserver" in _line(parent)
    return [p for p in family if is_rank(p)]
