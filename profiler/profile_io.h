// Profile <-> JSON. Reading validates everything an offline tool relies on and never throws:
// a malformed or inconsistent file gives false and one line naming what is wrong.
#pragma once

#include <string>

#include "profiler/profile.h"

namespace memplan {

std::string profile_to_json(const Profile& p, int indent = -1);
bool profile_from_json(const std::string& text, Profile* out, std::string* error);

bool write_profile_file(const std::string& path, const Profile& p, std::string* error);
bool read_profile_file(const std::string& path, Profile* out, std::string* error);

// Checks indices, sizes and links; used by the reader and by the recorder before it writes.
bool validate_profile(const Profile& p, std::string* error);

}  // namespace memplan
