"""Image decoders on the device: one small module per decoder, registered in the ``suite.decoders`` entry-point
group (see :mod:`.base`). Adapters name the decoder of each loader kind; nothing here is imported on the CPU
path unless its loader is asked for."""
