"""Storage: corpus files, findings and the finding store, replay, known bugs and their fixes, reports and exported tests."""
