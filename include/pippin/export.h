/* PP_API marks the functions of pippin's public C API: the library is built
 * with hidden visibility, so only these are exported from libpippin.so.
 * Thread safety: nothing here runs. */
#ifndef PIPPIN_EXPORT_H
#define PIPPIN_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define PP_API __attribute__((visibility("default")))
#else
#define PP_API
#endif

#endif
