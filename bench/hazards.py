"""Cost and store use of the collective-order guard (`hazards.check_collective_order`), on 2 gloo ranks with identical
data (no divergence):
- seconds per forward+backward with and without it, for LoRA leaves as FSDP1 units (the most collectives), FSDP1
  decoder-layer units and FSDP2 layer groups, and the guard's own cost per collective (one store round: write,
  wait, read, delete);
- the store's key count after the first guarded step and after `--store-steps` more (bounded: the same count).
Target: cheap enough to leave on for a whole job (a few ms per collective on CPU/gloo, where the store round trips
are the cost), and not one store key more per step.

    python bench/hazards.py [--steps 5] [--store-steps 1000]
"""
import argparse, time



def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--store-steps", type=int, default=1000)
    a = ap.parse_args(argv)
    from lora_fsdp_kit.testing import guard_runs as G
    from lora_fsdp_kit.launch import launch
    from lora_fsdp_kit.plan.wrap import WrapConfig
    for name, spec in [("switch", WrapConfig(flavour="fsdp1", policy="lora", use_orig_params=True)),
                       ("switch", WrapConfig(flavour="fsdp1", policy="layer", use_orig_params=True)),
                       ("llama", WrapConfig(flavour="fsdp2", targets="**.layers.*"))]:
        t0 = time.perf_counter()
        r = launch(G.guard_overhead, name, spec, a.steps, quiet=True, timeout=600)[0]
        print(f"{name:7s} {spec.label:40s} {r['collectives']:4d} collectives: {r['off_s']*1e3:8.1f} ms -> "
              f"{r['on_s']*1e3:8.1f} ms per step (x{r['ratio']:.2f}, {r['per_collective_ms']:.2f} ms per collective)"
              f"; one store round {r['round_ms']:.2f} ms  [{time.perf_counter() - t0:.0f} s]")
    t0 = time.perf_counter()
    r = launch(G.guard_store_keys, a.store_steps, quiet=True, timeout=1200)[0]
    k0, k1 = r["keys"]
    print(f"store keys: {k0} after 1 guarded step, {k1} after {r['steps']:,} more ({k1 - k0:+d}; "
          f"{r['collectives_per_step']} collectives per step, {r['steps'] * r['collectives_per_step']:,} store rounds); "
          f"one store round {r['round_ms']:.3f} ms; {r['run_s'] / (r['steps'] + 1) * 1e3:.1f} ms per guarded step "
          f"(branch model, FSDP1 layer units)  [{time.perf_counter() - t0:.0f} s]")


if __name__ == "__main__":
    main()
