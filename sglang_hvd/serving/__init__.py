"""Serving-side HVD, free of sglang: configuration from environment variables, the
per-step decision (drafter + features + gate), and trace recording. ``patches/`` adapts
these to SGLang's worker; everything here is testable without sglang or torch."""
