/* Prints the layout of the Linux Xen device uapi, one `name value` line each, for the Rust
 * ABI test (xen-platform/src/xen/abi.rs). Compiled with -DXEN_UAPI_TOPLEVEL (the kernel's
 * /usr/include/xen/*.h) or -DXEN_UAPI_SYS (libxen-dev's /usr/include/xen/sys/*.h). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/ioctl.h>

typedef uint16_t domid_t;     /* evtchn.h uses it; normally from Xen's public xen.h */
typedef uint32_t grant_ref_t; /* the kernel's gntdev.h uses it for grant copy */

#if defined(XEN_UAPI_TOPLEVEL)
#include <xen/evtchn.h>
#include <xen/gntalloc.h>
#include <xen/gntdev.h>
#elif defined(XEN_UAPI_SYS)
#include <xen/sys/evtchn.h>
#include <xen/sys/gntalloc.h>
#include <xen/sys/gntdev.h>
#else
#error "define XEN_UAPI_TOPLEVEL or XEN_UAPI_SYS"
#endif

#define SZ(t) printf("sizeof " #t " %lu\n", (unsigned long)sizeof(struct t))
#define OFF(t, f) printf("offsetof " #t "." #f " %lu\n", (unsigned long)offsetof(struct t, f))
#define VAL(v) printf(#v " %lu\n", (unsigned long)(v))

int main(void)
{
    SZ(ioctl_gntalloc_alloc_gref);
    OFF(ioctl_gntalloc_alloc_gref, domid);
    OFF(ioctl_gntalloc_alloc_gref, flags);
    OFF(ioctl_gntalloc_alloc_gref, count);
    OFF(ioctl_gntalloc_alloc_gref, index);
    OFF(ioctl_gntalloc_alloc_gref, gref_ids);
    SZ(ioctl_gntalloc_dealloc_gref);
    OFF(ioctl_gntalloc_dealloc_gref, index);
    OFF(ioctl_gntalloc_dealloc_gref, count);
    SZ(ioctl_gntalloc_unmap_notify);
    OFF(ioctl_gntalloc_unmap_notify, index);
    OFF(ioctl_gntalloc_unmap_notify, action);
    OFF(ioctl_gntalloc_unmap_notify, event_channel_port);
    SZ(ioctl_gntdev_grant_ref);
    OFF(ioctl_gntdev_grant_ref, domid);
    OFF(ioctl_gntdev_grant_ref, ref);
    SZ(ioctl_gntdev_map_grant_ref);
    OFF(ioctl_gntdev_map_grant_ref, count);
    OFF(ioctl_gntdev_map_grant_ref, pad);
    OFF(ioctl_gntdev_map_grant_ref, index);
    OFF(ioctl_gntdev_map_grant_ref, refs);
    SZ(ioctl_gntdev_unmap_grant_ref);
    OFF(ioctl_gntdev_unmap_grant_ref, index);
    OFF(ioctl_gntdev_unmap_grant_ref, count);
    OFF(ioctl_gntdev_unmap_grant_ref, pad);
    SZ(ioctl_gntdev_unmap_notify);
    OFF(ioctl_gntdev_unmap_notify, index);
    OFF(ioctl_gntdev_unmap_notify, action);
    OFF(ioctl_gntdev_unmap_notify, event_channel_port);
    SZ(ioctl_evtchn_bind_interdomain);
    OFF(ioctl_evtchn_bind_interdomain, remote_domain);
    OFF(ioctl_evtchn_bind_interdomain, remote_port);
    SZ(ioctl_evtchn_bind_unbound_port);
    OFF(ioctl_evtchn_bind_unbound_port, remote_domain);
    SZ(ioctl_evtchn_unbind);
    SZ(ioctl_evtchn_notify);
    SZ(ioctl_evtchn_restrict_domid);
    VAL(GNTALLOC_FLAG_WRITABLE);
    VAL(UNMAP_NOTIFY_CLEAR_BYTE);
    VAL(UNMAP_NOTIFY_SEND_EVENT);
    VAL(IOCTL_GNTALLOC_ALLOC_GREF);
    VAL(IOCTL_GNTALLOC_DEALLOC_GREF);
    VAL(IOCTL_GNTALLOC_SET_UNMAP_NOTIFY);
    VAL(IOCTL_GNTDEV_MAP_GRANT_REF);
    VAL(IOCTL_GNTDEV_UNMAP_GRANT_REF);
    VAL(IOCTL_GNTDEV_SET_UNMAP_NOTIFY);
    VAL(IOCTL_EVTCHN_BIND_INTERDOMAIN);
    VAL(IOCTL_EVTCHN_BIND_UNBOUND_PORT);
    VAL(IOCTL_EVTCHN_UNBIND);
    VAL(IOCTL_EVTCHN_NOTIFY);
    VAL(IOCTL_EVTCHN_RESET);
    VAL(IOCTL_EVTCHN_RESTRICT_DOMID);
    return 0;
}
