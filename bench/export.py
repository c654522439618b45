"""Bench: save_lora time and peak extra memory against model size and LoRA rank; merged-weight bucket stream peak
against bucket_bytes (beside the unbucketed stream), FSDP1 (peft's policy) and FSDP2, 2 gloo ranks on the CPU.

Narrow llamas of 8/16/32 decoder layers (hidden 256), LoRA r 8/32/128 on q/k/v/o. For each it prints the save time,
the peak extra memory on rank 0 / the adapter's bytes (held: only LoRA), and the model's bytes for scale; then the
merged stream's peak at several bucket sizes, its bound (one unit + one bucket + the tensor in flight) and the
ratio to the unbucketed peak. Saves bench/out/export_streams_<flavour>.png. Run: `python bench/export.py`.
"""
from __future__ import annotations

import argparse, os, tempfile

from lora_fsdp_kit.export.measure_streams import measure_save, measure_stream, plot_streams
from lora_fsdp_kit.plan.wrap import WrapConfig
from lora_fsdp_kit.launch import launch
from lora_fsdp_kit.models import add_lora, model_from_config
from lora_fsdp_kit.config_files import shipped_config
from lora_fsdp_kit.units import fmt_bytes

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")

def bench_model(layers:int, hidden:int, r:int):
    cfg = dict(shipped_config("llama"), num_hidden_layers=layers, hidden_size=hidden, intermediate_size=2 * hidden,
               head_dim=hidden // 4, num_attention_heads=4, num_key_value_heads=2)
    return add_lora(model_from_config(cfg, device="cpu"), r=r, alpha=2 * r)

def rank_saves(folder:str, flavour:str, sizes:list)->list[dict]:
    "Rank function: save each (layers, hidden, r) model twice (the second save replaces the first), measured."
    out = []
    for layers, hidden, r in sizes:
        pm = bench_model(layers, hidden, r)
        model_bytes = sum(p.numel() * p.element_size() for p in pm.parameters())
        fm = WrapConfig(flavour=flavour, policy="peft").wrap(pm)
        path = os.path.join(folder, f"{flavour}-{layers}-{r}")
        first, second = measure_save(fm, path), measure_save(fm, path)
        out.append(dict(layers=layers, r=r, model_bytes=model_bytes, first=first, second=second))
    return out

def rank_streams(flavour:str, layers:int, hidden:int, bucket_sizes:list)->list:
    "Rank function: the merged stream unbucketed, then at each bucket size."
    fm = WrapConfig(flavour=flavour, policy="peft").wrap(bench_model(layers, hidden, 8))
    return [measure_stream(fm, b) for b in [None, *bucket_sizes]]

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--flavours", nargs="+", default=["fsdp1", "fsdp2"])
    a = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    sizes = [(8, a.hidden, 8), (16, a.hidden, 8), (32, a.hidden, 8), (16, a.hidden, 32), (16, a.hidden, 128)]
    for fl in a.flavours:
        rows = launch(rank_saves, tempfile.mkdtemp(), fl, sizes, quiet=True, timeout=1200)[0]
        print(f"\n== save_lora, {fl}, 2 ranks (rank 0) ==")
        print(f"{'layers':>6}{'r':>5}{'model':>12}{'LoRA':>12}{'file':>12}{'save ms':>9}{'replace ms':>11}"
              f"{'peak extra':>12}{'peak/LoRA':>10}{'peak/model':>11}")
        for x in rows:
            s, s2 = x["first"], x["second"]
            print(f"{x['layers']:>6}{x['r']:>5}{fmt_bytes(x['model_bytes']):>12}{fmt_bytes(s.lora_bytes):>12}"
                  f"{fmt_bytes(s.file_bytes):>12}{s.seconds * 1e3:>9.0f}{s2.seconds * 1e3:>11.0f}"
                  f"{fmt_bytes(s.peak_extra):>12}{s.peak_extra / s.lora_bytes:>10.2f}"
                  f"{s.peak_extra / x['model_bytes']:>11.3f}")
        buckets = [2**16, 2**18, 2**20, 2**22]
        streams = launch(rank_streams, fl, 16, a.hidden, buckets, quiet=True, timeout=1200)[0]
        whole = streams[0]
        print(f"\n== merged stream, {fl}, 16 layers, 2 ranks (rank 0): {fmt_bytes(whole.stream_bytes)} in all ==")
        print(f"{'buckets':>12}{'n':>5}{'peak extra':>12}{'bound':>12}{'peak/bound':>11}{'peak/unbucketed':>16}"
              f"{'ms':>7}")
        for p in streams:
            print(f"{p.label.replace(' buckets', ''):>12}{len(p.sizes):>5}{fmt_bytes(p.peak_extra):>12}"
                  f"{fmt_bytes(p.bound):>12}{p.peak_extra / p.bound:>11.2f}{p.peak_extra / whole.peak_extra:>16.2f}"
                  f"{p.seconds * 1e3:>7.0f}")
        fig = plot_streams(streams, title=f"{fl}: merged weights of a 16-layer llama, bucketed vs not")
        fig.savefig(os.path.join(OUT, f"export_streams_{fl}.png"), dpi=90)
