"""The chassis model, learned on the host (issue 25; docs/control.md, "The chassis
model"): the module's probe -> die parameters (:mod:`.probe`, evaluated as the
firmware does in :mod:`.fw`), the host's dynamic model of the die and the time to
throttle (:mod:`.dynamic`), the cooling trend for dust and fan wear (:mod:`.trend`),
one learner per module (:mod:`.learner`)."""

from modbridge.chassis.learner import ChassisLearner, ChassisReport

__all__ = ["ChassisLearner", "ChassisReport"]
