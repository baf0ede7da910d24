//! XenStore wire protocol (`io/xs_wire.h`): codec, client and embedded server.
