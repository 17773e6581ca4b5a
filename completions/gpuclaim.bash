# bash completion for gpuclaim (generated: scripts/gen_completions.py).
# Load it with `source gpuclaim.bash`, or run `gpuclaim --install-completion`.
_gpuclaim_completion() {
    local IFS=$'\n'
    local response completion
    response=$(env COMP_WORDS="${COMP_WORDS[*]}" COMP_CWORD=$COMP_CWORD \
        _GPUCLAIM_COMPLETE=bash_complete "$1" 2>/dev/null)
    COMPREPLY=()
    for completion in $response; do
        case ${completion%%,*} in
            dir) compopt -o dirnames ;;
            file) compopt -o default ;;
            plain) COMPREPLY+=("${completion#*,}") ;;
        esac
    done
    return 0
}
complete -o nosort -F _gpuclaim_completion gpuclaim
