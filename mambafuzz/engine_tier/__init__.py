"""The engine tier: replay scenarios through a real vLLM engine (CPU backend) and audit a
live engine's mamba prefix cache from the scheduler side.

The harness tier (`mambafuzz.sim.engine.harness`) drives vLLM's real scheduler with a simulated model
runner; this tier closes the gap by running the real model runner and kernels, so a
finding can be confirmed end to end (cached vs uncached outputs of an actual model).
Nothing here is imported by the quick paths: it costs an engine start-up (~40 s).
"""
