// How the loader's findings are shown to a person: the notes and warnings, the "auto" values
// that shape the job (printed loudly, together), and the migration report of `strata config
// check` (each key of the file and what Strata did with it).
#pragma once

#include <cstdio>
#include <string>

#include "config/config.h"

namespace strata::config {

// "strata: note: PATH: MESSAGE" / "strata: warning: PATH: MESSAGE" lines, one per note.
std::string format_notes(const Loaded& loaded);

// The block that says which "auto" values were chosen and why; "" when there were none.
std::string format_autos(const Loaded& loaded);

// The migration report: one row per key given (at most `rows_max`), then the counts.
std::string format_key_report(const Loaded& loaded, const std::string& file,
                              std::size_t rows_max = 200);

const char* to_string(KeyUse use);

}  // namespace strata::config
