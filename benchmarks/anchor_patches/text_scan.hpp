#pragma once

// Plain scans of text that replace std::regex in the JIT (added by pulsar-dosa's anchor patch):
// std::regex compiled in this extension crashed inside libstdc++'s locale facets when torch's
// process had loaded another build of the same template code. Each function returns what the
// regular expression named in its comment returns, and uses no locale.

#include <cstddef>
#include <string>
#include <vector>

namespace deep_gemm::text_scan {

// \s of the regular expressions here ("C" locale): space, \t, \n, \v, \f, \r
inline bool is_space(const char c) {
    return c == ' ' or c == '\t' or c == '\n' or c == '\v' or c == '\f' or c == '\r';
}

inline bool is_digit(const char c) {
    return c >= '0' and c <= '9';
}

// End of a match of  #\s*include\s*[<"][^>"]+[>"]  starting at `begin` (code[begin] == '#'),
// or std::string::npos where none starts there.
inline std::size_t include_directive_end(const std::string& code, std::size_t begin) {
    static const std::string keyword = "include";
    std::size_t i = begin + 1;
    while (i < code.size() and is_space(code[i]))
        ++ i;
    if (code.compare(i, keyword.size(), keyword) != 0)
        return std::string::npos;
    i += keyword.size();
    while (i < code.size() and is_space(code[i]))
        ++ i;
    if (i >= code.size() or (code[i] != '<' and code[i] != '"'))
        return std::string::npos;
    const std::size_t name_begin = ++ i;
    while (i < code.size() and code[i] != '>' and code[i] != '"')
        ++ i;
    if (i == name_begin or i >= code.size())
        return std::string::npos;
    return i + 1;
}

// Every match of  #\s*include\s*[<"][^>"]+[>"]  in `code`, left to right, not overlapping
// (what std::sregex_iterator yields for it).
inline std::vector<std::string> include_directives(const std::string& code) {
    std::vector<std::string> found;
    std::size_t i = code.find('#');
    while (i != std::string::npos) {
        const std::size_t end = include_directive_end(code, i);
        if (end == std::string::npos) {
            i = code.find('#', i + 1);
        } else {
            found.push_back(code.substr(i, end - i));
            i = code.find('#', end);
        }
    }
    return found;
}

// The first  release (\d+\.\d+)  in `text`: true with its two numbers, else false.
inline bool release_version(const std::string& text, int& major, int& minor) {
    static const std::string word = "release ";
    for (std::size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
        std::size_t i = at + word.size(), first = i;
        while (i < text.size() and is_digit(text[i]))
            ++ i;
        if (i == first or i >= text.size() or text[i] != '.')
            continue;
        const std::size_t second = ++ i;
        while (i < text.size() and is_digit(text[i]))
            ++ i;
        if (i == second)
            continue;
        major = std::stoi(text.substr(first, second - 1 - first));
        minor = std::stoi(text.substr(second, i - second));
        return true;
    }
    return false;
}

}  // namespace deep_gemm::text_scan
