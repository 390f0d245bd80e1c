/*
 * ABI guard: the module is compiled against UCX internal headers (from the
 * Debian source package, with a config.h that reproduces the installed build).
 * If those headers do not match the loaded libuct, struct layouts differ and
 * the transport would corrupt memory. libuct exports every UCS class object
 * with the sizeof() it was built with; comparing them with our sizeof() at
 * load time catches a mismatched build before anything is registered.
 */
#ifndef UCT_RC_VQP_ABI_H_
#define UCT_RC_VQP_ABI_H_

#include <ucs/type/status.h>
#include <stddef.h>

typedef struct uct_rc_vqp_abi_entry {
    const char *name;    /* type name, for the warning */
    size_t library_size; /* size recorded in the loaded UCX library */
    size_t header_size;  /* sizeof() in this module's compilation */
} uct_rc_vqp_abi_entry_t;

/* Fill @a entries (at most @a max) with the types the transport depends on.
 * Returns the number of entries written. */
unsigned uct_rc_vqp_abi_collect(uct_rc_vqp_abi_entry_t *entries, unsigned max);

/* Compare library and header sizes. On the first mismatch writes a message
 * naming the type and both sizes to @a msg and returns
 * UCS_ERR_UNSUPPORTED; UCS_OK when all match. */
ucs_status_t uct_rc_vqp_abi_check(const uct_rc_vqp_abi_entry_t *entries,
                                  unsigned count, char *msg, size_t max);

/* Collect and check; logs one warning on mismatch. Used by the constructor. */
ucs_status_t uct_rc_vqp_abi_verify(void);

#endif
