import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

from mlagents_plugin.fast_protobuf import PTH_LINE, PTH_NAME


class BuildWithPth(build_py):
    """Also put the fast-protobuf .pth at the top of the wheel (NOTE [ Fast protobuf ]): harmless
    where protobuf is older than 4 (Python 3.10), needed where it is protobuf 6 (Python 3.11)."""

    def run(self) -> None:
        super().run()
        with open(os.path.join(self.build_lib, PTH_NAME), "w") as f:
            f.write(PTH_LINE)


setup(
    name="mlagents-plugin",
    version="0.1.0",
    description=(
        "A supervised env manager for Unity ML-Agents: nothing hangs, nothing leaks, "
        "every failure is explained."
    ),
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    author="mlagents-plugin developers",
    # Apache-2.0 (ML-Agents' metadata names the Apache licence too). LICENSE goes into the sdist and
    # the wheel (.dist-info/licenses).
    license="Apache-2.0",
    license_files=["LICENSE"],
    keywords=["unity", "ml-agents", "reinforcement-learning", "environment", "multiprocessing", "supervision"],
    packages=find_packages(include=["mlagents_plugin", "mlagents_plugin.*"]) + ["mlagents_plugin.config"],
    # The example configurations the docs use ship in the wheel (python -m mlagents_plugin examples).
    package_dir={"mlagents_plugin.config": "config"},
    package_data={"mlagents_plugin.config": ["*.yaml"]},
    cmdclass={"build_py": BuildWithPth},
    # ML-Agents 1.0.0 and 1.1.0 run on Python 3.10 (their own) and, with docs/install.md's
    # overrides, 3.11. Linux is tested; macOS and Windows take the portable path (docs/platforms.md).
    python_requires=">=3.10",
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Operating System :: POSIX :: Linux",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    # Installed, reinstalled (--force-reinstall), upgraded (-U) or uninstalled in an environment
    # made by ML-Agents' own instructions, this moves no version of anything there but setuptools
    # (docs/install.md; .ci/official_venv.sh checks each). --force-reinstall reinstalls every
    # requirement below at the newest version it allows, and pip does not look at what installed
    # packages ask for: so what ML-Agents also needs is asked for with ML-Agents' own bounds
    # (mlagents and mlagents-envs 1.0.0 and 1.1.0 declare these same ones), and numpy not at all.
    # numpy is pinned by mlagents-envs, ==1.21.2 in 1.0.0 and >=1.23.5,<1.24.0 in 1.1.0: no one
    # bound keeps both (<1.24 would take 1.0.0's 1.21.2 to 1.23.5, no bound took 1.23.5 to 2.x,
    # which has no np.float), and the plugin never runs without mlagents-envs, which brings it.
    # mlagents itself is not listed: on Python 3.11 its metadata cannot be satisfied
    # (grpcio<=1.48.2), and mlagents-learn checks the version it finds at start.
    install_requires=[
        "attrs>=19.3.0",
        "cattrs>=1.1.0,<1.7",
        "cloudpickle",
        "Pillow>=4.2.1",
        "psutil>=5.9",
        "pyyaml>=3.1.0",
        # mlagents imports pkg_resources, which setuptools 81 removed: without this pin a fresh
        # `pip install mlagents==1.1.0` cannot start mlagents-learn.
        "setuptools<81",
        # Python 3.10 prints exception notes through the PEP 678 backport (core/errors.py).
        "exceptiongroup>=1.1; python_version < '3.11'",
        # Python 3.11 only (docs/install.md): gRPC's first wheels for it, and protobuf 6's C
        # backend, which the .pth above serves to mlagents-envs.
        "grpcio>=1.49; python_version >= '3.11'",
        "protobuf>=6.31; python_version >= '3.11'",
    ],
    extras_require={
        "dev": [
            "pytest>=7", "pytest-timeout>=2.1", "pytest-xdist>=3", "hypothesis>=6.100",
            "ruff==0.17.6", "mypy==2.4.1", "build", "twine>=6.1",
        ],
        # env workers as Ray actors (docs/ray.md); Ray core only, no dashboard stack
        "ray": ["ray==2.60.0"],
    },
    entry_points={
        "mlagents.trainer_type": ["mlagents_plugin = mlagents_plugin.integration.entry:register"],
        "pytest11": ["mlagents_plugin = mlagents_plugin.testing.pytest_plugin"],
        "console_scripts": ["mlagents-plugin-player = mlagents_plugin.player.__main__:main"],
    },
)
