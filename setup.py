from setuptools import setup

setup(
    name="pipesplit",
    version="0.1.0",
    description="Pipeline-parallel schedules and PIR program splitting for PaddlePaddle static graphs",
    python_requires=">=3.9",
    packages=["pipesplit", "pipesplit.job_list", "pipesplit.ir_utils", "pipesplit.passes", "pipesplit.tools"],
    package_dir={
        "pipesplit": "pipesplit",
        "pipesplit.job_list": "job_list",
        "pipesplit.ir_utils": "ir_utils",
        "pipesplit.passes": "passes",
        "pipesplit.tools": "tools",
    },
    package_data={
        "pipesplit.job_list": ["golden/*"],
        # reference orders of PyTorch 2.13 / Paddle 3.3.1 for tools/bench_frameworks.py
        "pipesplit.tools": ["reference_orders/*.md", "reference_orders/*/*"],
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
