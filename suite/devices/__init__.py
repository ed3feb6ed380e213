"""Device adapters: the interface (:mod:`.base`) and one small module per device, registered in the
``suite.devices`` entry-point group."""
