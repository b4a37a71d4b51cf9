// Whole-file text I/O with one-line errors, shared by the profile and plan file formats.
#pragma once

#include <string>

namespace memplan {

// Writes `text` and a newline to `path` (replacing it). False and one line in `error` on failure.
bool write_text_file(const std::string& path, const std::string& text, std::string* error);
// Reads all of `path` into `text`. False and one line in `error` when it cannot be opened.
bool read_text_file(const std::string& path, std::string* text, std::string* error);

}  // namespace memplan
