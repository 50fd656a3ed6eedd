"""Hostile model: tries to lift each of its hard limits; the error it raises lists the outcome of each."""
import resource


def make_model():
    outcome = []
    for name in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_NPROC"):
        which = getattr(resource, name)
        soft, hard = resource.getrlimit(which)
        try:
            resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            outcome.append(f"{name} raised")
        except (ValueError, OSError):
            outcome.append(f"{name} refused (hard limit {hard}, soft {soft})")
    raise RuntimeError("; ".join(outcome))
