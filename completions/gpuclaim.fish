# fish completion for gpuclaim (generated: scripts/gen_completions.py).
# Put it in ~/.config/fish/completions/, or run `gpuclaim --install-completion`.
function __gpuclaim_complete
    set -l response (env COMP_WORDS=(commandline -cp) _GPUCLAIM_COMPLETE=fish_complete \
        gpuclaim 2>/dev/null)
    for completion in $response
        set -l item (string split -m 1 "," -- $completion)
        switch $item[1]
            case dir
                __fish_complete_directories (commandline -ct)
            case file
                __fish_complete_path (commandline -ct)
            case plain
                printf '%s\n' $item[2]
        end
    end
end
complete --command gpuclaim --no-files --arguments "(__gpuclaim_complete)"
