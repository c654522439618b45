"""`python -m lora_fsdp_kit demo` as a user runs it: on one rank (how people debug), and stopped with SIGTERM while its
ranks run — then no process or temporary folder is left and the previous results in `--out` are intact; and `fits`,
the step-memory predictor, reached through the kit's command line."""
import json, os, signal, subprocess, sys, time
from pathlib import Path

import psutil

from procs import rank_processes

def _env(tmp:Path)->dict:
    "The environment with a private temp folder, so the launch folder can be found and checked."
    (tmp/"t").mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp/"t")}

def _demo(tmp:Path, *args, **kw):
    return subprocess.Popen([sys.executable, "-m", "lora_fsdp_kit", "demo", "--model", "llama", *args], env=_env(tmp),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)

def _previous_demo(out:Path)->dict:
    "A folder holding an earlier demo's results; returns its files' contents."
    out.mkdir()
    (out/"old.png").write_bytes(b"\x89PNG old"); (out/"report.md").write_text("# the old report\n")
    (out/"summary.json").write_text(json.dumps({"figures": {"old": "old.png"}}))
    return {p.name: p.read_bytes() for p in out.iterdir()}

def test_demo_on_one_rank(tmp_path):
    p = _demo(tmp_path, "--nprocs", "1", "--out", str(tmp_path/"out"))
    out = p.communicate(timeout=900)[0]
    assert p.returncode == 0, out
    assert "[4/6] launching 1 rank:" in out and "[6/6] writing the summary and report.md" in out and "[7/" not in out
    assert "s of it starting up" in out
    s = json.loads((tmp_path/"out"/"summary.json").read_text())
    assert set(s["exact"]) == {"fsdp1", "fsdp2"} and s["seconds"] > s["startup_seconds"] > 0
    assert "strip" not in s and "strip.png" not in s["figures"].values()        # a Llama has nothing to strip
    assert {f.name for f in (tmp_path/"out").iterdir()} == set(s["figures"].values()) | {"report.md", "summary.json"}
    assert not list((tmp_path/"t").glob("lfk_launch_*"))

def test_demo_sigterm_keeps_previous_results(tmp_path):
    out = tmp_path/"out"
    before = _previous_demo(out)
    p = _demo(tmp_path, "--out", str(out), start_new_session=True)
    try:
        end = time.monotonic() + 600
        def ranks_running():
            runs = list((tmp_path/"t").glob("lfk_launch_*"))
            return runs and all((runs[0]/f"rank{r}.txt").exists() for r in (0, 1))
        while not ranks_running():
            assert p.poll() is None, p.stdout.read()
            assert time.monotonic() < end, "the demo's ranks did not start"
            time.sleep(0.2)
        family = psutil.Process(p.pid).children(recursive=True)
        assert len(rank_processes(family)) == 2
        p.send_signal(signal.SIGTERM)
        log = p.communicate(timeout=60)[0]
        assert p.returncode == 128 + signal.SIGTERM, log
        gone, alive = psutil.wait_procs(family, timeout=30)
        assert not alive, [" ".join(c.cmdline())[:80] for c in alive]
        assert {f.name: f.read_bytes() for f in out.iterdir()} == before          # the old results, untouched
        assert {f.name for f in tmp_path.iterdir()} == {"out", "t"}                # no work folder beside --out
        assert not list((tmp_path/"t").glob("lfk_launch_*"))                     # the launch folder is gone
    finally:
        if p.poll() is None: p.kill()
        p.wait()

def test_fits_subcommand(capsys):
    "`lfk fits` takes the wrap flags `plan` takes and calls `fits.fits_report` (a real interpreter); bad input exits 2."
    r = subprocess.run([sys.executable, "-m", "lora_fsdp_kit", "fits", "--help"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    for flag in ("--model", "--config", "--dora", "--device-memory", "--world",
                 "--use-orig-params", "--param-dtype", "--lora-dtype", "--reserve",
                 "--max-batch", "--max-seq", "--verbose", "--sharding", "--reshard-after-forward", "--lora-leaves"):
        assert flag in r.stdout, flag
    words = " ".join(r.stdout.split())
    assert "(default 2GiB)" in words and "CUDA context" in words and "exit codes: 0 every setting fits" in words
    from lora_fsdp_kit.__main__ import main
    assert main(["fits", "--config", "llama", "--world", "2", "--device-memory", "lots"]) == 2   # before any model
    assert "fits: error:" in capsys.readouterr().err
    # --model NAME, as plan, explore and demo take it: a shipped name, checked before any import
    assert main(["fits", "--model", "lama", "--world", "2", "--device-memory", "8GiB"]) == 2
    assert "unknown model 'lama'; did you mean llama?" in capsys.readouterr().err
    # a flag with nothing near is sent to the help, which is never offered as the nearest match
    assert main(["fits", "--model", "llama", "--zzz"]) == 2
    assert capsys.readouterr().err.endswith("fits: unknown flag --zzz; see python -m lora_fsdp_kit fits --help\n")
    assert "fits" in subprocess.run([sys.executable, "-m", "lora_fsdp_kit", "--help"], capture_output=True, text=True,
                                    timeout=300).stdout

def test_fits_unitless_memory_refused_at_once():
    "A size without a unit: exit 2 with the fix, in under a second, before torch (and the tracer) is imported."
    code = ("import sys, time; t = time.process_time(); from lora_fsdp_kit.__main__ import main; "   # CPU s: load-proof
            "rc = main(['fits', '--config', 'llama', '--world', '8', '--device-memory', '80']); "
            "print(rc, time.process_time() - t, 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    rc, seconds, torch_loaded = r.stdout.split()
    assert (rc, torch_loaded) == ("2", "False"), r.stdout + r.stderr
    assert float(seconds) < 1, seconds
    assert r.stderr == "fits: error: --device-memory 80: add a unit, 80GiB or 80GB\n", r.stderr
    r = subprocess.run([sys.executable, "-m", "lora_fsdp_kit", "fits", "--config", "llama", "--world", "8",
                        "--device-memory", "80GiB", "--reserve", "2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr == "fits: error: --reserve 2: add a unit, 2GiB or 2GB\n", r.stderr

def test_wrap_flags_read_the_same_in_plan_and_fits():
    "A true/false wrap flag in every form, in both commands: alone it is on, --no-X is off, or it takes on|off."
    from lora_fsdp_kit.__main__ import parser
    from lora_fsdp_kit.cli_wrap import wrap_config_of, wrap_configs_of
    p = parser()
    head = {"plan": ["plan", "--model", "llama", "--flavour", "fsdp2"],
            "fits": ["fits", "--model", "llama", "--world", "2", "--device-memory", "8GiB", "--flavour", "fsdp2"]}
    for cmd, argv in head.items():
        for flags, want in ((["--no-lora-leaves"], False), (["--lora-leaves", "off"], False), (["--lora-leaves"], True),
                            (["--lora-leaves", "on"], True), (["--no-reshard-after-forward"], False),
                            (["--reshard-after-forward", "off"], False)):
            a = p.parse_args(argv + flags)
            field = flags[0].removeprefix("--").removeprefix("no-").replace("-", "_")
            got = {getattr(c, field) for c in (wrap_configs_of(a, sweep=True) if cmd == "fits" else [wrap_config_of(a)])}
            assert got == {want}, (cmd, flags, got)
    help_ = {cmd: " ".join(p._subparsers._group_actions[0].choices[cmd].format_help().split()) for cmd in head}
    assert all("--lora-leaves [on|off]" in h and "--reshard-after-forward [on|off]" in h for h in help_.values()), help_

def _paragraphs(out:str)->list[tuple[list[str], str, str]]:
    "`lfk plan`'s paragraphs as printed: (their lines, first line's indent, the rest's), the summary and each finding's."
    from lora_fsdp_kit.plan.text import MARKS
    lines = out.splitlines()
    head = next(i for i, l in enumerate(lines) if " plan of " in l)
    paras = [(lines[head:next(i for i, l in enumerate(lines) if l.startswith("policy"))], "", "    ")]
    for l in lines[next(i for i, l in enumerate(lines) if l.startswith("findings:")):]:
        if l.startswith("findings:") or l[2] in MARKS.values(): paras.append(([l], l[:len(l) - len(l.lstrip())], None))
        elif l.startswith(" " * 6) and (paras[-1][2] is None or l.lstrip().startswith("fix: ")):
            paras.append(([l], " " * 6, " " * 6))   # a finding's message, then its fix: their own paragraphs
        else: paras[-1][0].append(l)
    return [(ls, first, rest if rest is not None else ("  " if ls[0].startswith("findings") else " " * 6))
            for ls, first, rest in paras]

def test_plan_wraps_each_paragraph_once(capsys):
    """`lfk plan` printed the plan's text wrapped at 120 with each line over 100 folded again: 1-3-word tails ('but keeps
    gradient' alone on a line). Each paragraph (the summary, a finding's line, its message, its fix) is wrapped once."""
    import textwrap
    from lora_fsdp_kit.__main__ import main
    assert main(["plan", "--model", "llama"]) == 0
    out = capsys.readouterr().out
    paras = _paragraphs(out)
    assert len(paras) >= 5 and sum(len(ls) > 1 for ls, *_ in paras) >= 3, out   # long enough to need a wrap
    for ls, first, rest in paras:
        once = textwrap.wrap(" ".join(" ".join(ls).split()), 100, initial_indent=first, subsequent_indent=rest,
                             break_on_hyphens=False)
        assert ls == once, "\n".join(ls)

def test_plan_builds_the_job_s_whole_lora(capsys, tmp_path):
    """`lfk plan --job adapter_config.json` plans the LoRA peft builds from the file, not r and targets alone: with
    `layers_to_transform=[0]` and `exclude_modules` peft adapts 2 modules of layer 0 (4 tensors), not 3 modules of
    every layer (12): what fits (which builds with `Job.build`) traces."""
    from peft import LoraConfig
    from lora_fsdp_kit.__main__ import main
    LoraConfig(r=8, target_modules=["q_proj", "v_proj", "down_proj"], rank_pattern={"down_proj": 16},
               layers_to_transform=[0], exclude_modules=["v_proj"]).save_pretrained(str(tmp_path))
    assert main(["plan", "--model", "llama", "--job", str(tmp_path / "adapter_config.json")]) == 0
    out = capsys.readouterr().out
    assert "LoRA 4 tensors" in out, out
