"""Trainer types this package registers with ML-Agents (``mlagents.trainer_type``): see
docs/trainers.md. Imported by ``mlagents-learn`` only when it registers plugins' trainers."""
