"""What a run is asked to do (`RunConfig`) and the checks on it that come before anything is written."""

from __future__ import annotations

from dataclasses import dataclass, field

from models.training import TrainConfig
from profiler import samplers, tracing


class UsageError(Exception):
    """Bad options or a missing device/data: `error: ...`, exit code 2."""


@dataclass
class RunConfig:
    device: str = "auto"
    gpus: int | None = None
    tpu: str | None = None
    data: str = "auto"
    data_dir: str | None = None
    limit_images: int | None = None
    out: str = "runs"
    run_name: str | None = None
    train: TrainConfig = field(default_factory=TrainConfig)
    profile: bool = True
    profile_steps: str | None = None
    tracer: tracing.TracerOptions = field(default_factory=tracing.TracerOptions)
    profiler_port: int | None = None
    scalars_every: int = 10
    sample: bool = True
    sample_interval: float = 0.5
    measure_peak: bool = False
    quiet: bool = False

    def validate(self) -> None:
        """Raise `UsageError` naming the first option that cannot work."""
        t = self.train
        checks = [
            (t.epochs >= 1, f"--epochs must be at least 1 (got {t.epochs})"),
            (t.batch_size >= 1, f"--batch-size must be at least 1 (got {t.batch_size})"),
            (t.steps_per_execution >= 1, f"--steps-per-execution must be at least 1 (got {t.steps_per_execution})"),
            (self.limit_images is None or self.limit_images >= 1, f"--limit-images must be at least 1 (got {self.limit_images})"),
            (t.inject_input_delay_ms >= 0, "--inject-input-delay-ms cannot be negative"),
            (t.inject_host_delay_ms >= 0, "--inject-host-delay-ms cannot be negative"),
            (self.scalars_every >= 1, f"--scalars-every must be at least 1 (got {self.scalars_every})"),
        ]
        for ok, message in checks:
            if not ok:
                raise UsageError(message)
        try:
            samplers.validate_interval(self.sample_interval)
        except ValueError as exc:
            raise UsageError(f"--sample-interval: {exc}") from None
        if self.profile_steps:
            try:
                tracing.parse_window(self.profile_steps)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
