"""The in-process federation simulator: transport, faults, Byzantine devices, partitions, meter."""

from .byzantine import ByzantineTamper, choose_byzantine, poison_devices
from .meter import CommunicationMeter
from .transport import InProcessTransport, RunOutput, draw_faults

__all__ = ["InProcessTransport", "RunOutput", "draw_faults", "CommunicationMeter",
           "ByzantineTamper", "choose_byzantine", "poison_devices"]
