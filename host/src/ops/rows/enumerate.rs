//! Every feasible plan for a row op's spec and shape on a device (being written).
