/* The loaded library's version (pippin/version.h). */
#include "pippin/version.h"

const char *pp_version(void) { return PIPPIN_VERSION_STRING; }
int pp_version_number(void) { return PIPPIN_VERSION_NUMBER; }
