"""Fleet rollouts on the device: releases, their bake and the shared rollout records (docs/fleet.md)."""
