"""Overhead of the collective-order guard (`hazards.check_collective_order`): seconds per forward+backward with and
without it, on 2 gloo ranks with identical data (no divergence), for LoRA leaves as FSDP1 units (the most collectives),
FSDP1 decoder-layer units and FSDP2 layer groups. Target: cheap enough to leave on for a first step (a few ms per
collective on CPU/gloo, where the store round trips are the cost).

    python bench/hazards.py [--steps 5]
"""
import argparse, time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args(argv)
    from lora_fsdp_kit import testing as T
    from lora_fsdp_kit.launch import launch
    for name, spec in [("switch", dict(policy="lora", use_orig_params=True)),
                       ("switch", dict(policy="layer", use_orig_params=True)),
                       ("llama", dict(flavour="fsdp2", targets="**.layers.*"))]:
        t0 = time.perf_counter()
        r = launch(T.guard_overhead, name, spec, a.steps, quiet=True, timeout=600)[0]
        print(f"{name:7s} {str(spec):55s} {r['collectives']:4d} collectives: {r['off_s']*1e3:8.1f} ms -> "
              f"{r['on_s']*1e3:8.1f} ms per step (x{r['ratio']:.2f}, {r['per_collective_ms']:.2f} ms per collective)"
              f"; one store round {r['round_ms']:.2f} ms  [{time.perf_counter() - t0:.0f} s]")


if __name__ == "__main__":
    main()
