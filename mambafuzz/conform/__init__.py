"""The conformance tier: the kernel model held against vLLM's own worker code, called on CPU
(V1 `v1`, V2 `v2`), the driver that feeds both the same steps (`drive`), the rows they compare
(`rows`), the comparison (`compare`) and the `--target conform` verdict (`target`)."""
