"""Interventions on a trained model (protocol §8): forward-time edits of the phases, the B/C rotation and
the decays (`forward`), and parameter edits that return new parameters (`edits`)."""
from ssmgate.interventions.edits import edit_param, scale_gate
from ssmgate.interventions.forward import CHECKS, KINDS, Intervention, intervened_model

__all__ = ["CHECKS", "KINDS", "Intervention", "edit_param", "intervened_model", "scale_gate"]
