from setuptools import find_packages, setup

setup(
    name="mlagents-plugin",
    version="0.1.0",
    description=(
        "A supervised env manager for Unity ML-Agents: nothing hangs, nothing leaks, "
        "every failure is explained."
    ),
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["mlagents_plugin", "mlagents_plugin.*"]),
    # 3.11: exception notes (PEP 678); Linux: pidfds, /proc and /dev/shm (docs/install.md)
    python_requires=">=3.11",
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.11",
        "Operating System :: POSIX :: Linux",
    ],
    # mlagents and mlagents-envs 1.1.0 are deliberately not listed: their metadata cannot be
    # satisfied on Python 3.11 (see docs/install.md and requirements/mlagents-py311.txt).
    install_requires=[
        "attrs",
        "grpcio>=1.49",
        "Pillow",
        "cattrs>=1.1,<1.7",
        "cloudpickle",
        "numpy>=1.23.5,<1.24",
        "psutil>=5.9",
        "pyyaml",
    ],
    extras_require={
        "dev": [
            "pytest>=7", "pytest-timeout>=2.1", "pytest-xdist>=3", "hypothesis>=6.100",
            "ruff==0.17.6", "mypy==2.4.1",
        ],
        # env workers as Ray actors (docs/ray.md); Ray core only, no dashboard stack
        "ray": ["ray==2.60.0"],
    },
    entry_points={
        "mlagents.trainer_type": ["mlagents_plugin = mlagents_plugin.integration.plugin:register"],
        "pytest11": ["mlagents_plugin = mlagents_plugin.testing.pytest_plugin"],
        "console_scripts": ["mlagents-plugin-player = mlagents_plugin.player.__main__:main"],
    },
)
