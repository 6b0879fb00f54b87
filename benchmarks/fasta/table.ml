(* Symbol tables with cumulative probabilities, and the selection of a symbol for a
   uniform draw. *)

type t = { symbols : Bytes.t; cumulative : float array }

let of_list pairs =
  let n = List.length pairs in
  let symbols = Bytes.create n and cumulative = Array.make n 0. in
  let _ =
    List.fold_left
      (fun (i, acc) (c, p) ->
        let acc = acc +. p in
        Bytes.set symbols i c;
        cumulative.(i) <- acc;
        (i + 1, acc))
      (0, 0.) pairs
  in
  { symbols; cumulative }

let size t = Bytes.length t.symbols

(* First index whose cumulative probability exceeds [r]; the last one otherwise. *)
let find_index pred n =
  let rec go i = if i >= n - 1 || pred i then i else go (i + 1) in
  go 0

let pick t r = Bytes.unsafe_get t.symbols (find_index (fun i -> r < Array.unsafe_get t.cumulative i) (size t))

let iub =
  of_list
    ([ ('a', 0.27); ('c', 0.12); ('g', 0.12); ('t', 0.27) ]
    @ List.map (fun c -> (c, 0.02)) [ 'B'; 'D'; 'H'; 'K'; 'M'; 'N'; 'R'; 'S'; 'V'; 'W'; 'Y' ])

let homo_sapiens =
  of_list
    [ ('a', 0.3029549426680); ('c', 0.1979883004921); ('g', 0.1975473066391); ('t', 0.3015094502008) ]
