// vlsparse-golden: writes the golden files of every algorithm from the exact reference.
//
//   vlsparse-golden OUT_DIR            (the project's files: vlsparse-golden golden/)
//
// One source file per algorithm (golden_<algorithm>.cpp) defines its cases and its writer.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

namespace vlsparse::golden {
void write_zipvl_golden(const std::filesystem::path& root);
void write_blindsight_golden(const std::filesystem::path& root);
void write_avl_golden(const std::filesystem::path& root);
void write_baselines_golden(const std::filesystem::path& root);
void write_purekv_golden(const std::filesystem::path& root);
}  // namespace vlsparse::golden

int main(int argc, char** argv) try {
    if (argc != 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
        std::puts("usage: vlsparse-golden OUT_DIR\n\nWrites OUT_DIR/<algorithm>/<case>/ from the exact reference "
                  "(the project's files: vlsparse-golden golden/).");
        return argc == 2 ? 0 : 2;
    }
    const std::filesystem::path root = argv[1];
    vlsparse::golden::write_zipvl_golden(root);
    vlsparse::golden::write_blindsight_golden(root);
    vlsparse::golden::write_avl_golden(root);
    vlsparse::golden::write_baselines_golden(root);
    vlsparse::golden::write_purekv_golden(root);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "vlsparse-golden: error: %s\n", e.what());
    return 1;
}
