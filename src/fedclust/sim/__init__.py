"""The in-process federation simulator: transport, faults, Byzantine devices, partitions, meter."""

from .byzantine import ByzantineTamper, choose_byzantine, poison_devices
from .meter import CommunicationMeter
from .faults import draw_faults
from .transport import InProcessTransport, RunOutput

__all__ = ["InProcessTransport", "RunOutput", "draw_faults", "CommunicationMeter",
           "ByzantineTamper", "choose_byzantine", "poison_devices"]
