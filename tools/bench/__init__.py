"""Benchmarks and reports: each measures pipesplit side by side with what it is compared with
(``python tools/bench/<name>.py --help``); the command line is one folder up."""
