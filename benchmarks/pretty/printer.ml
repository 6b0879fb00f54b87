(* Format printers with boxes and break hints for the language of Doc. *)

open Format

let comma ppf () = fprintf ppf ",@ "
let semi ppf () = fprintf ppf ";@ "

let rec expr ppf = function
  | Doc.Int n -> pp_print_int ppf n
  | Doc.Var v -> pp_print_string ppf v
  | Doc.Str s -> fprintf ppf "%S" s
  | Doc.Binop (op, a, b) -> fprintf ppf "@[<hov 2>(%a@ %s %a)@]" expr a op expr b
  | Doc.Call (f, args) -> fprintf ppf "@[<hov 2>%s(@,%a)@]" f (pp_print_list ~pp_sep:comma expr) args
  | Doc.Record fields ->
      let field ppf (k, v) = fprintf ppf "@[<hv 2>%s =@ %a@]" k expr v in
      fprintf ppf "@[<hv 2>{ %a@;<1 -2>}@]" (pp_print_list ~pp_sep:semi field) fields
  | Doc.Fun (params, body) ->
      fprintf ppf "@[<v 2>@[<h>fun (%a) {@]@,%a@;<0 -2>}@]"
        (pp_print_list ~pp_sep:(fun ppf () -> pp_print_string ppf ", ") pp_print_string) params
        block body

and stmt ppf = function
  | Doc.Let (v, e) -> fprintf ppf "@[<hov 2>let %s =@ %a;@]" v expr e
  | Doc.If (c, t, []) -> fprintf ppf "@[<v 2>@[<hov 2>if (%a) {@]@,%a@;<0 -2>}@]" expr c block t
  | Doc.If (c, t, e) ->
      fprintf ppf "@[<v 2>@[<hov 2>if (%a) {@]@,%a@;<0 -2>} else {@,%a@;<0 -2>}@]" expr c block t block e
  | Doc.While (c, b) -> fprintf ppf "@[<v 2>@[<hov 2>while (%a) {@]@,%a@;<0 -2>}@]" expr c block b
  | Doc.Return e -> fprintf ppf "@[<hov 2>return@ %a;@]" expr e
  | Doc.Expr e -> fprintf ppf "@[<hov 2>%a;@]" expr e

and block ppf stmts = fprintf ppf "@[<v 0>%a@]" (pp_print_list ~pp_sep:pp_print_cut stmt) stmts

let program ppf stmts = fprintf ppf "@[<v 0>%a@]@." block stmts
