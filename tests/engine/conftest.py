"""Engine tests: no fixtures here. Being a conftest of a folder without __init__.py, this file
puts tests/engine on the import path, so tests in subfolders (models/) import engine_helpers."""
