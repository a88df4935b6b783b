// text_scan.hpp against the std::regex forms it replaces in DeepGEMM's JIT, on the files named on
// the command line (each file's text, and each of its lines as a version string):
//   g++ -std=c++17 -I benchmarks/anchor_patches benchmarks/anchor_patches/text_scan_check.cpp -o check
//   ./check FILE...      prints "files N, directives M, versions V, mismatches X"; exit 1 on a mismatch
#include <fstream>
#include <iostream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "text_scan.hpp"

namespace {

std::vector<std::string> regex_directives(const std::string& code) {
    static const std::regex pattern(R"(#\s*include\s*[<"][^>"]+[>"])");
    std::vector<std::string> found;
    for (std::sregex_iterator it(code.begin(), code.end(), pattern), end; it != end; ++ it)
        found.push_back(it->str());
    return found;
}

bool regex_version(const std::string& text, int& major, int& minor) {
    static const std::regex pattern(R"(release (\d+\.\d+))");
    std::smatch match;
    if (not std::regex_search(text, match, pattern))
        return false;
    return std::sscanf(match[1].str().c_str(), "%d.%d", &major, &minor) == 2;
}

}  // namespace

int main(int argc, char** argv) {
    long files = 0, directives = 0, versions = 0, mismatches = 0;
    for (int a = 1; a < argc; ++ a) {
        std::ifstream in(argv[a], std::ios::binary);
        if (not in) {
            std::cerr << "cannot read " << argv[a] << "\n";
            return 2;
        }
        const std::string code((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        ++ files;
        const auto want = regex_directives(code);
        directives += static_cast<long>(want.size());
        if (want != deep_gemm::text_scan::include_directives(code)) {
            ++ mismatches;
            std::cerr << "include directives differ: " << argv[a] << "\n";
        }
        std::istringstream lines(code);
        for (std::string line; std::getline(lines, line);) {
            int major = -1, minor = -1, got_major = -1, got_minor = -1;
            const bool want_found = regex_version(line, major, minor);
            const bool found = deep_gemm::text_scan::release_version(line, got_major, got_minor);
            versions += want_found;
            if (want_found != found or (found and (major != got_major or minor != got_minor))) {
                ++ mismatches;
                std::cerr << "release version differs: " << argv[a] << ": " << line << "\n";
            }
        }
    }
    std::cout << "files " << files << ", directives " << directives << ", versions " << versions
              << ", mismatches " << mismatches << "\n";
    return mismatches == 0 ? 0 : 1;
}
