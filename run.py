"""KVBench entry point: ``python run.py model=... method=... task=... budget=...`` (Hydra)."""

import os
import signal
import sys
from pathlib import Path

import hydra
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="configs", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Compose the config and hand it to the configured runner."""
    from runners.registry import run_from_config

    return run_from_config(cfg)


def _terminated(signum: int, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def cli() -> None:
    """Run ``main``; a config that does not compose ends with one error line and exit code 2.

    The checkout is put on ``PYTHONPATH`` so the processes a run starts (OOM probes, submitit
    workers) import KVBench from it too: the install puts no KVBench module in site-packages."""
    root = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    # Let Hydra raise instead of printing multi-line reports; real bugs keep their full traceback.
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    # SIGTERM (kill, a scheduler's time limit) ends a run as Ctrl-C does: its record says "interrupted".
    signal.signal(signal.SIGTERM, _terminated)
    from runners.results.store import renamed_override

    renamed = renamed_override(sys.argv[1:])  # Hydra's own message would be a struct error
    if renamed is not None:
        print(f"error: {renamed}", file=sys.stderr)
        sys.exit(2)
    try:
        main()
    except MissingConfigException as err:
        options = f" (available: {', '.join(err.options)})" if err.options else ""
        hint = "; any other model: model=hf model.id=<hub id or folder>" if "'model/" in str(err) else ""
        print(f"error: {str(err).splitlines()[0]}{options}{hint}", file=sys.stderr)
        sys.exit(2)
    except (ConfigCompositionException, OverrideParseException) as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # the run's record says status "interrupted" (runners.output.record.recording)
        print("interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    cli()
