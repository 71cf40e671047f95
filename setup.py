import os
import re

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))


def read(name: str) -> str:
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return f.read()


# one place for the version: pipesplit/__init__.py (pipesplit.__version__, pipesplit --version)
VERSION = re.search(r'^__version__ = "([^"]+)"', read("pipesplit/__init__.py"), re.M).group(1)

setup(
    name="pipesplit",
    version=VERSION,
    description="Pipeline-parallel schedules and PIR program splitting for PaddlePaddle static graphs",
    long_description=read("README.md"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE"],
    keywords=["paddlepaddle", "pipeline parallelism", "zero bubble", "PIR", "scheduling"],
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "License :: OSI Approved :: Apache Software License",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Typing :: Typed",
    ],
    python_requires=">=3.9",
    packages=["pipesplit", "pipesplit.job_list", "pipesplit.ir_utils", "pipesplit.passes",
              "pipesplit.passes.engine", "pipesplit.passes.measure", "pipesplit.passes.split",
              "pipesplit.passes.transport",
              "pipesplit.tools", "pipesplit.tools.bench"],
    package_dir={
        "pipesplit": "pipesplit",
        "pipesplit.job_list": "job_list",
        "pipesplit.ir_utils": "ir_utils",
        "pipesplit.passes": "passes",
        "pipesplit.tools": "tools",
    },
    package_data={
        "pipesplit": ["py.typed"],  # PEP 561: the package and its sub-packages carry types
        "pipesplit.job_list": ["golden/*"],
        # reference orders of PyTorch 2.13 / Paddle 3.3.1 for tools/bench/bench_frameworks.py
        "pipesplit.tools.bench": ["reference_orders/*.md", "reference_orders/*/*"],
    },
    install_requires=["numpy"],
    extras_require={
        "paddle": ["paddlepaddle==3.3.1"],
        "plot": ["matplotlib"],
        "test": ["pytest", "matplotlib", "paddlepaddle==3.3.1"],
    },
    entry_points={"console_scripts": [
        "pipesplit=pipesplit.tools.cli:main",
        # the per-rank trainer, for `python -m paddle.distributed.launch ... pipesplit-train`
        "pipesplit-train=pipesplit.tools.train:main",
    ]},
)
